"""What the engine asks of an executor: the ranks' KV blocks at start-up, steps sent and
their results taken in the order they finish, transitions and Seesaw moves on a set of
ranks, a call on every rank, the ranks lost since the last ask, and the end.

`UniprocExecutor` (uniproc.py) runs the one rank in the engine's process; `MultiprocExecutor`
(multiproc.py) runs each rank in a process of its own, and `RayExecutor` (ray_executor.py)
each in a Ray actor. The engine never asks which one it has (`make_executor` picks it)."""
from typing import TYPE_CHECKING, NoReturn, Protocol

if TYPE_CHECKING:
    from parashift.worker.model_runner import ModelRunner


class WorkerFailure(RuntimeError):
    """No group of the node can serve any more (raised by every later use)."""


class HostDown(RuntimeError):
    """A replacement needs a host that is lost and has not come back yet (its agent)."""


class TransitionAborted(RuntimeError):
    """A rank of a transition was lost while it was prepared or committed: every rank of
    it is lost (the engine takes their groups out); the layout stays as it was."""


def first_line(reason: str) -> str:
    return reason.splitlines()[0].rstrip(":")


class Executor(Protocol):
    rank_blocks: list[int]  # each rank's KV blocks
    load_seconds: float  # the slowest rank's loading
    failure: WorkerFailure | None  # once set, the executor serves no more
    lost: dict[int, str]  # rank -> why, every rank lost so far

    @property
    def alive(self) -> list[int]:
        """The ranks not lost."""

    @property
    def local_runner(self) -> "ModelRunner | None":
        """The model runner in the engine's own process (one device only), else None."""

    def submit(self, tag, ranks: tuple[int, ...], output_rank: int, batch) -> None:
        """Sends a step to `ranks`; `wait_any` returns its result from `output_rank`."""

    def wait_any(self) -> list[tuple[object, object]]:
        """(tag, result) of the steps that finished; waits for at least one (or a loss)."""

    def transition(self, ranks: list[int], verb: str, plan_names: list[str],
                   epoch: int = 0) -> float:
        """One phase ("prepare", "commit") of a transition; the slowest rank's seconds."""

    def seesaw_move(self, ranks: list[int], verb: str, plan_names: list[str], moves: list,
                    tier) -> list[dict]:
        """One phase ("out", "in") of a Seesaw group's KV and weight moves; each rank's stats."""

    def collective_rpc(self, method: str, *args) -> list:
        """`ModelRunner.<method>(*args)` on every live rank, in rank order."""

    def check_health(self) -> None:
        """Loses the ranks that died or stopped answering; raises once it has failed."""

    def take_lost(self) -> dict[int, str]:
        """The ranks lost since the last call, with why."""

    def retire(self, ranks, reason: str) -> None:
        """Loses live `ranks` on the engine's word (their group lost another rank)."""

    def replace(self, ranks: tuple[int, ...]) -> None:
        """Starts new processes for lost `ranks` (self-healing); ValueError where it
        cannot, HostDown while a host of theirs is lost."""

    def take_replaced(self) -> list:
        """The replacements that ended since the last call (replacement.Outcome)."""

    def fail(self, message: str) -> NoReturn:
        """Stops every rank and raises WorkerFailure (as every later use does)."""

    def shutdown(self) -> None:
        """Stops every rank."""


class RanksNeverLost:
    """What an executor whose ranks cannot be lost answers (one device in the engine's
    process, a simulation): no health to watch, no losses; `fail` still stops it."""
    failure: WorkerFailure | None = None

    def check_health(self) -> None:
        """Nothing to watch."""

    def take_lost(self) -> dict[int, str]:
        return {}

    def retire(self, ranks, reason: str) -> None:
        """No rank is ever lost."""

    def replace(self, ranks: tuple[int, ...]) -> None:
        raise ValueError("this executor's ranks cannot be replaced")

    def take_replaced(self) -> list:
        return []

    def fail(self, message: str) -> NoReturn:
        self.failure = WorkerFailure(message)
        raise self.failure
