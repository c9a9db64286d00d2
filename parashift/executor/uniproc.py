"""One device, in the engine's own process. A submitted step is launched at
once, so with async scheduling the host prepares the next step while the
device runs this one."""
from collections import deque

from parashift.step.message import StepBatch
from parashift.worker.model_runner import ModelRunner, PendingStep


class UniprocExecutor:
    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self.rank_blocks = [runner.num_blocks]
        self.load_seconds = runner.load_seconds
        self._pending: deque[tuple[object, PendingStep]] = deque()

    def submit(self, tag, ranks: tuple[int, ...], output_rank: int, batch: StepBatch) -> None:
        self._pending.append((tag, self.runner.launch(batch)))

    def wait_any(self) -> list[tuple[object, object]]:
        """The oldest launched step's (tag, result)."""
        tag, step = self._pending.popleft()
        return [(tag, step.result())]

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
