"""Where a rank's start-up time goes: the model runner (worker/) and the designs' hooks
time their phases (model build, a design's weight staging, the KV pool, warm-up, graph
capture) and the rank logs them once it is ready, one line per phase, then all of them in
one line: a warning where start-up took longer than SLOW_STARTUP_S (workers log at warning
level unless configured; a slow start is worth one line a rank)."""
import contextlib
import logging
import time

logger = logging.getLogger(__name__)
SLOW_STARTUP_S = 30.0


class StartupPhases:
    def __init__(self, rank: int = 0):
        self.rank = rank
        self.seconds: dict[str, float] = {}  # phase -> seconds
        self.outer: set[str] = set()  # the phases timed inside no other
        self._depth = 0
        self._start = time.perf_counter()

    @contextlib.contextmanager
    def phase(self, name: str):
        """Times the block as phase `name` (added to it where timed before); a phase inside
        another is a part of it (its line says "of" the outer one's)."""
        if not self._depth:
            self.outer.add(name)
        self.seconds.setdefault(name, 0.0)  # listed in the order started
        self._depth += 1
        start = time.perf_counter()
        try:
            yield
        finally:
            self._depth -= 1
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    @property
    def total_s(self) -> float:
        return time.perf_counter() - self._start

    def report(self) -> None:
        """One info line per phase, then all of them in one line with the untimed rest (the
        phases inside others listed, not summed twice)."""
        total = self.total_s
        for name, seconds in self.seconds.items():
            logger.info("rank %d start-up, %s%s: %.2f s", self.rank,
                        "" if name in self.outer else "  of which ", name, seconds)
        log = logger.warning if total > SLOW_STARTUP_S else logger.info
        rest = total - sum(s for name, s in self.seconds.items() if name in self.outer)
        log("rank %d start-up %.1f s: %s, other %.2f s", self.rank, total,
            ", ".join(f"{'' if name in self.outer else 'of which '}{name} {s:.2f} s"
                      for name, s in self.seconds.items()), rest)
