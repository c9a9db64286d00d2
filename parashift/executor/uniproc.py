"""One device, in the engine's own process. A submitted step is launched at
once, so with async scheduling the host prepares the next step while the
device runs this one."""
from collections import deque

from parashift.worker.model_runner import ModelRunner, PendingStep
from parashift.worker.step_batch import StepBatch


class UniprocExecutor:
    num_replicas = 1

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self.num_blocks = [runner.num_blocks]
        self.block_offsets = [0]
        self.replica_groups = [0]
        self.load_seconds = runner.load_seconds
        self._pending: deque[PendingStep] = deque()

    def submit(self, replica: int, batch: StepBatch) -> None:
        self._pending.append(self.runner.launch(batch))

    def wait_any(self) -> list[tuple[int, object]]:
        """The oldest launched step's result."""
        return [(0, self._pending.popleft().result())]

    def check_health(self) -> None:
        """Nothing to watch: the device runs in this process."""

    def transition(self, ranks: list[int], verb: str, plan_names: list[str],
                   epoch: int = 0) -> float:
        """One phase of a transition on these ranks (here: the one); its slowest seconds."""
        return max(self.runner.transition(verb, name, epoch) for name in plan_names)

    def collective_rpc(self, method: str, *args) -> list:
        """`ModelRunner.<method>(*args)` on the one rank, as a one-item list."""
        return [getattr(self.runner, method)(*args)]

    def shutdown(self) -> None:
        self._pending.clear()
