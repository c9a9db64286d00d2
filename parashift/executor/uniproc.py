"""One device, in the engine's own process."""
from parashift.engine.model_runner import ModelRunner
from parashift.engine.step_batch import StepBatch


class UniprocExecutor:
    num_replicas = 1

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self.num_blocks = [runner.num_blocks]
        self.block_offsets = [0]
        self.load_seconds = runner.load_seconds
        self._pending: StepBatch | None = None

    def submit(self, replica: int, batch: StepBatch) -> None:
        self._pending = batch

    def wait_any(self) -> list[tuple[int, object]]:
        batch, self._pending = self._pending, None
        return [(0, self.runner.execute(batch))]

    def shutdown(self) -> None:
        pass
