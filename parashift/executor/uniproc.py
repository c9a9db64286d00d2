"""One device, in the engine's own process. A submitted step is launched at
once, so with async scheduling the host prepares the next step while the
device runs this one."""
from collections import deque

from parashift.executor.base import RanksNeverLost, WorkerFailure
from parashift.step.message import StepBatch
from parashift.worker.model_runner import ModelRunner, PendingStep


class UniprocExecutor(RanksNeverLost):
    """The one rank: it is never lost (an error in a step is the engine's own)."""

    def __init__(self, config, hf_config, source, device, dtype, max_model_len: int):
        self.runner = ModelRunner(config, hf_config, source, device, dtype, max_model_len)
        self.rank_blocks = [self.runner.num_blocks]
        self.load_seconds = self.runner.load_seconds
        self.failure: WorkerFailure | None = None
        self.lost: dict[int, str] = {}
        self._pending: deque[tuple[object, PendingStep]] = deque()

    @property
    def alive(self) -> list[int]:
        return [0]

    @property
    def local_runner(self) -> ModelRunner:
        return self.runner

    def submit(self, tag, ranks: tuple[int, ...], output_rank: int, batch: StepBatch) -> None:
        self._pending.append((tag, self.runner.launch(batch)))

    def wait_any(self) -> list[tuple[object, object]]:
        """The oldest launched step's (tag, result)."""
        tag, step = self._pending.popleft()
        return [(tag, step.result())]

    def transition(self, ranks: list[int], verb: str, plan_names: list[str],
                   epoch: int = 0) -> float:
        """One phase of a transition on these ranks (here: the one); its slowest seconds."""
        return max(self.runner.transition(verb, name, epoch) for name in plan_names)

    def seesaw_move(self, ranks: list[int], verb: str, plan_names: list[str], moves: list,
                    tier) -> list[dict]:
        """One phase of a seesaw group's moves on the one rank (ModelRunner.seesaw_move)."""
        return [self.runner.seesaw_move(verb, name, moves, tier) for name in plan_names]

    def collective_rpc(self, method: str, *args) -> list:
        """`ModelRunner.<method>(*args)` on the one rank, as a one-item list."""
        return [getattr(self.runner, method)(*args)]

    def shutdown(self) -> None:
        self._pending.clear()
