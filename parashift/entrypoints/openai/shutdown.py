"""The end of `--shutdown-timeout`: requests still running then end themselves.

uvicorn, past its graceful-shutdown timeout, cancels the request tasks: a stream
is cut with no ending, a waiting non-streamed request gets a plain-text 500 and
the log fills with CancelledError tracebacks. So the server starts this deadline
when its shutdown begins, and uvicorn's own timeout comes a little later: when
the deadline passes, each stream still open gets an error event and `[DONE]`,
and each request still waiting for its reply a JSON 503 (`shutdown_timeout`)."""
import asyncio
import contextlib
import signal
from typing import Callable

import uvicorn


class ShutdownTimeoutError(RuntimeError):
    """The server's shutdown timeout passed before this request finished."""


class ShutdownDeadline:
    """`--shutdown-timeout` seconds after `start()`; runs the watchers when it passes."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.passed = False
        self._watchers: set[Callable[[], None]] = set()
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Called, inside the event loop, when the server's shutdown begins."""
        if self._handle is None:
            self._handle = asyncio.get_running_loop().call_later(self.timeout, self._pass)

    def _pass(self) -> None:
        self.passed = True
        for watcher in list(self._watchers):
            watcher()

    def error(self) -> ShutdownTimeoutError:
        return ShutdownTimeoutError(
            f"the server shut down before this request finished (its shutdown timeout of "
            f"{self.timeout:g} s passed); retry it")

    @contextlib.contextmanager
    def watch(self, on_pass: Callable[[], None]):
        """Calls `on_pass()` if the deadline passes (or has passed) inside the block."""
        if self.passed:
            on_pass()
        self._watchers.add(on_pass)
        try:
            yield
        finally:
            self._watchers.discard(on_pass)

    @contextlib.asynccontextmanager
    async def bound(self):
        """Cancels the block when the deadline passes and raises ShutdownTimeoutError
        (the awaited work's own clean-up, e.g. aborting its request, runs first)."""
        loop = asyncio.get_running_loop()
        timeout = asyncio.timeout(None)
        try:
            async with timeout:
                with self.watch(lambda: timeout.reschedule(loop.time())):
                    yield
        except TimeoutError:
            if not timeout.expired():
                raise
            raise self.error() from None


class DrainingServer(uvicorn.Server):
    """uvicorn's server, starting `deadline` when its shutdown begins. With a
    `drain_delay`, the first SIGTERM or SIGINT only marks `readiness` draining; the
    shutdown follows `drain_delay` seconds later (a second signal: at once)."""

    def __init__(self, config: uvicorn.Config, deadline: ShutdownDeadline | None,
                 readiness=None, drain_delay: float = 0.0):
        super().__init__(config)
        self.deadline = deadline
        self.readiness, self.drain_delay = readiness, drain_delay

    def handle_exit(self, sig, frame) -> None:
        draining = self.readiness is not None and self.readiness.draining.is_set()
        if self.readiness is None or self.drain_delay <= 0 or draining:
            return super().handle_exit(sig, frame)
        self.readiness.start_draining(self.drain_delay,
                                      lambda: super(DrainingServer, self).handle_exit(sig, frame))

    @contextlib.contextmanager
    def capture_signals(self):
        """As uvicorn's, except that a SIGTERM the server has drained for is not raised
        again once it has stopped: the process exits 0, as a supervisor's stop expects
        (uvicorn's re-raise makes it 143). Ctrl-C (SIGINT) still ends it as one."""
        with super().capture_signals():
            yield
            self._captured_signals = [sig for sig in self._captured_signals
                                      if sig != signal.SIGTERM]

    async def shutdown(self, sockets=None) -> None:
        if self.deadline is not None:
            self.deadline.start()
        await super().shutdown(sockets)
