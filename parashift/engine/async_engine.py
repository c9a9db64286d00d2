"""Runs `LLMEngine.step()` in a thread of its own and streams outputs to asyncio.

The engine object is touched only by the engine thread: the event loop sends it
commands (add, abort, stop) through a queue, and the thread sends outputs back
with `loop.call_soon_threadsafe`. HTTP handling therefore never stalls a step,
and a long step never stalls HTTP handling.

If a step raises, the engine is dead: every pending request fails with
`EngineDeadError` and new ones are refused (the server's /health turns 503).
While idle the thread checks the engine's health (its worker processes) on every
wake-up, at least every `IDLE_WAKE_S`, so a rank that dies with no request in
flight kills the engine within about a second too; and it lets a policy that acts
when idle change the layout then (`LLMEngine.idle_turn`)."""
import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from parashift.executor import WorkerFailure
from parashift.outputs import RequestOutput, join_deltas
from parashift.sampling_params import SamplingParams
from parashift.structured.matchers import NO_CONTINUATION

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine loop has stopped; no request can be served."""


class RequestFailedError(RuntimeError):
    """The engine failed this one request (the others go on)."""


class ConstraintFailedError(RequestFailedError):
    """No token of the vocabulary continues the request's structured output: its
    constraint asks for what the model cannot spell (the client's to fix)."""


class QueueFullError(RuntimeError):
    """More requests wait than `max_num_queued_requests` allows."""


@dataclass
class RequestStream:
    """The event-loop side of one request: its outputs and timings."""
    request_id: str
    num_prompt_tokens: int
    accepted: asyncio.Future
    arrival: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    num_output_tokens: int = 0
    finished: bool = False
    delta: bool = False  # its outputs carry what is new only (output_kind "delta")
    _queue: asyncio.Queue = field(default_factory=asyncio.Queue)

    def put(self, item: RequestOutput | BaseException) -> None:
        self._queue.put_nowait(item)

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        """Yields the outputs; when the reader lags, those waiting as one: the newest
        (cumulative) or their deltas joined."""
        while True:
            item = await self._queue.get()
            while not self._queue.empty() and not isinstance(item, BaseException):
                newer = self._queue.get_nowait()
                item = (join_deltas(item, newer) if self.delta and not isinstance(
                    newer, BaseException) else newer)
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.finished:
                return


@dataclass
class _Add:
    stream: RequestStream
    prompt: str | list[int]
    params: SamplingParams
    priority: int


@dataclass
class _Abort:
    request_id: str


@dataclass
class _Call:
    function: Callable
    result: asyncio.Future


_STOP = object()
IDLE_WAKE_S = 0.25  # an idle engine thread wakes this often (to check the engine's health)


class AsyncLLMEngine:
    """Asyncio front of an `LLMEngine`; one per server."""

    def __init__(self, engine, *, max_num_queued_requests: int | None = None, metrics=None):
        if max_num_queued_requests is not None and max_num_queued_requests < 1:
            raise ValueError("max_num_queued_requests must be >= 1 (or None for no limit)")
        self.engine = engine
        self.max_num_queued_requests = max_num_queued_requests
        self.metrics = metrics
        self._commands: queue.Queue = queue.Queue()
        self._streams: dict[str, RequestStream] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._dead: EngineDeadError | None = None
        self._death_callbacks: list = []
        self._stopping = False
        self._count_lock = threading.Lock()
        self._num_unsent_adds = 0  # adds queued for the engine thread, not yet handed over
        self._engine_num_waiting = 0  # from the last stats() of the engine thread
        self._engine_request_ids: set[str] = set()  # engine thread only
        self._faults = getattr(engine, "faults", None)  # the engine's last FaultReport seen

    # ---- lifecycle -------------------------------------------------------
    def start(self) -> None:
        """Starts the engine thread; call from inside the running event loop."""
        if self._thread is not None:
            raise RuntimeError("AsyncLLMEngine already started")
        self._loop = asyncio.get_running_loop()
        if self.metrics is not None:
            self.metrics.set_baseline(self.engine.stats())
            self.metrics.record_layout(self.engine.layout_info())
            if self._faults is not None:
                self.metrics.record_faults(self._faults)
        self._thread = threading.Thread(target=self._run_loop, name="parashift-engine",
                                        daemon=True)
        self._thread.start()

    async def shutdown(self, timeout: float = 10.0) -> None:
        """Fails what is still pending, aborts it in the engine, stops the thread."""
        self._stopping = True
        self._fail_all(EngineDeadError("the server is shutting down"))
        self._commands.put(_STOP)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, timeout)

    def on_death(self, callback) -> None:
        """Calls `callback()` in the event loop once the engine has died (after its
        requests failed); the CLI server stops on it, to exit non-zero."""
        self._death_callbacks.append(callback)

    @property
    def is_running(self) -> bool:
        alive = self._thread is not None and self._thread.is_alive()
        return alive and self._dead is None and not self._stopping

    @property
    def dead_error(self) -> EngineDeadError | None:
        return self._dead

    @property
    def num_waiting(self) -> int:
        with self._count_lock:
            return self._num_unsent_adds + self._engine_num_waiting

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    # ---- requests (event loop side) ---------------------------------------
    async def add_request(self, request_id: str, prompt: str | list[int],
                          params: SamplingParams, priority: int = 0,
                          num_prompt_tokens: int | None = None) -> RequestStream:
        """Hands a request to the engine; returns once the engine accepted it.

        Raises ValueError (bad input, as the engine says), QueueFullError or
        EngineDeadError."""
        self._check_can_add(request_id)
        loop = asyncio.get_running_loop()
        n_prompt = num_prompt_tokens if num_prompt_tokens is not None else (
            len(prompt) if isinstance(prompt, list) else 0)
        stream = RequestStream(request_id, n_prompt, loop.create_future(),
                               delta=params.output_kind == "delta")
        self._streams[request_id] = stream
        with self._count_lock:
            self._num_unsent_adds += 1
        self._commands.put(_Add(stream, prompt, params, priority))
        try:
            await asyncio.shield(stream.accepted)
        except asyncio.CancelledError:
            self.abort(request_id)
            raise
        except BaseException:
            self._streams.pop(request_id, None)
            raise
        return stream

    def _check_running(self) -> None:
        if self._dead is not None:
            raise self._dead
        if self._stopping or self._thread is None:
            raise EngineDeadError("the engine is not running")

    def _check_can_add(self, request_id: str) -> None:
        self._check_running()
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")
        limit = self.max_num_queued_requests
        if limit is not None and self.num_waiting >= limit:
            raise QueueFullError(f"{self.num_waiting} requests are waiting, the limit is "
                                 f"{limit}; retry later")

    async def generate(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                       priority: int = 0) -> AsyncIterator[RequestOutput]:
        """Streams cumulative outputs; aborts the request if the caller stops early."""
        stream = await self.add_request(request_id, prompt, params, priority)
        try:
            async for output in stream:
                yield output
        finally:
            if not stream.finished:
                self.abort(request_id)

    async def call(self, function: Callable):
        """`function(engine)` run on the engine thread between steps (nothing else touches
        the engine); returns its result or raises its exception here."""
        self._check_running()
        result = asyncio.get_running_loop().create_future()
        self._commands.put(_Call(function, result))
        return await result

    def abort(self, request_id: str) -> None:
        """Forgets the request here and frees it in the engine. Safe to repeat."""
        stream = self._streams.pop(request_id, None)
        if stream is None or stream.finished:
            return
        stream.finished = True
        if self.metrics is not None:
            self.metrics.requests_aborted.inc()
        if self._dead is None and not self._stopping:
            self._commands.put(_Abort(request_id))

    # ---- event loop side of the engine thread's results --------------------
    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        now = time.monotonic()
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue  # aborted meanwhile
            self._account(stream, output, now)
            stream.put(output if output.error is None else _failure(output.error))
            if output.finished:
                stream.finished = True
                del self._streams[output.request_id]

    def _account(self, stream: RequestStream, output: RequestOutput, now: float) -> None:
        tokens = sum(len(c.token_ids) for c in output.outputs)  # all n samples
        num_new = tokens if stream.delta else tokens - stream.num_output_tokens
        num_output_tokens = stream.num_output_tokens + num_new
        if num_new > 0 and stream.first_token_at is None:
            stream.first_token_at = _first_token_at(output, now)
        stream.num_output_tokens = num_output_tokens
        if self.metrics is None:
            return
        self.metrics.record_new_tokens(num_new)
        if output.finished:
            self._record_finished(stream, output, now)

    def _record_finished(self, stream: RequestStream, output: RequestOutput, now: float):
        ttft = None if stream.first_token_at is None else stream.first_token_at - stream.arrival
        tpot = None
        if stream.num_output_tokens > 1 and stream.first_token_at is not None:
            tpot = (now - stream.first_token_at) / (stream.num_output_tokens - 1)
        self.metrics.record_finished(
            num_prompt_tokens=len(output.prompt_token_ids), finish_reason=(
                output.outputs[0].finish_reason or "unknown"),
            num_output_tokens=stream.num_output_tokens, ttft=ttft, e2e=now - stream.arrival,
            tpot=tpot)

    def _accept(self, stream: RequestStream, error: BaseException | None) -> None:
        if stream.accepted.done():
            return
        if error is None:
            stream.accepted.set_result(None)
        else:
            stream.accepted.set_exception(error)

    def _fail_all(self, error: BaseException) -> None:
        for stream in list(self._streams.values()):
            stream.finished = True
            if not stream.accepted.done():
                stream.accepted.set_exception(error)
            stream.put(error)
        self._streams.clear()

    # ---- engine thread ---------------------------------------------------
    def _run_loop(self) -> None:
        try:
            while not self._stopping:
                idle = not self.engine.has_unfinished_requests()
                if not self._apply_commands(block=idle):
                    break
                if idle:
                    self.engine.check_health()  # a dead worker is noticed with no step to fail
                    self._record_faults()
                    if self.engine.idle_turn():  # the policy's layout for an idle node
                        self._after_step([])
                if not self.engine.has_unfinished_requests():
                    continue
                outputs = self.engine.step()
                self._after_step(outputs)
        except BaseException as exc:  # noqa: BLE001 - any failure kills the engine
            self._die(exc)
            return
        self._abort_remaining()

    def _apply_commands(self, block: bool) -> bool:
        """Applies queued commands; False once told to stop."""
        try:
            command = (self._commands.get(timeout=IDLE_WAKE_S) if block
                       else self._commands.get_nowait())
        except queue.Empty:
            return not self._stopping
        commands = [command]
        while commands[-1] is not _STOP:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                break
        adds: list[_Add] = []  # one hand-over for the adds in a row (one message to a core)
        for command in commands:
            if isinstance(command, _Add):
                adds.append(command)
                continue
            self._add(adds)
            adds = []
            if command is _STOP:
                return False
            self._apply(command)
        self._add(adds)
        self._refresh_waiting()
        return True

    def _apply(self, command) -> None:
        if isinstance(command, _Call):
            self._run_call(command)
        elif command.request_id in self._engine_request_ids:  # an _Abort
            self._engine_request_ids.discard(command.request_id)
            self.engine.abort_request(command.request_id)

    def _add(self, adds: list[_Add]) -> None:
        if not adds:
            return
        errors = self.engine.add_requests([(a.stream.request_id, a.prompt, a.params,
                                            a.priority) for a in adds])
        for add, error in zip(adds, errors):
            if error is None:
                self._engine_request_ids.add(add.stream.request_id)
            elif not isinstance(error, ValueError):  # one bad request must not kill the engine
                logger.error("add_request failed for %s", add.stream.request_id,
                             exc_info=error)
                error = RuntimeError("the engine could not take the request "
                                     f"({type(error).__name__})")
            self._loop.call_soon_threadsafe(self._accept, add.stream, error)
        num_waiting = self.engine.stats().num_waiting
        with self._count_lock:  # counted as unsent or as waiting, never as neither
            self._num_unsent_adds -= len(adds)
            self._engine_num_waiting = num_waiting

    def _run_call(self, command: _Call) -> None:
        try:
            value, error = command.function(self.engine), None
        except Exception as exc:  # noqa: BLE001 - the caller gets it; the engine goes on
            value, error = None, exc
        self._loop.call_soon_threadsafe(_settle, command.result, value, error)

    def _refresh_waiting(self) -> None:
        stats = self.engine.stats()
        with self._count_lock:
            self._engine_num_waiting = stats.num_waiting
        if self.metrics is not None:
            self.metrics.record_queue(stats)

    def _after_step(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            if output.finished:
                self._engine_request_ids.discard(output.request_id)
        stats = self.engine.stats()
        with self._count_lock:
            self._engine_num_waiting = stats.num_waiting
        self._record_faults()
        if self.metrics is not None:
            transitions = self.engine.take_transition_records()
            self.metrics.record_step(stats, self.engine.take_step_records(), transitions)
            if self.engine.seesaw:
                self.metrics.record_phase_seconds(self.engine.take_phase_seconds())
            if transitions:
                self.metrics.record_layout(self.engine.layout_info())
        if outputs:
            self._loop.call_soon_threadsafe(self._dispatch, outputs)

    @property
    def faults(self):
        """The engine's `FaultReport` (groups down, ranks alive), as of its last step."""
        return self._faults

    def _record_faults(self) -> None:
        """A new fault report (a group was lost) goes to the metrics with the new layout."""
        faults = getattr(self.engine, "faults", None)
        if faults is self._faults:
            return
        self._faults = faults
        if self.metrics is not None:
            self.metrics.record_faults(faults)
            self.metrics.record_layout(self.engine.layout_info())

    def _abort_remaining(self) -> None:
        """Leaves the engine clean on stop (it may be reused, as in tests)."""
        for request_id in list(self._engine_request_ids):
            try:
                self.engine.abort_request(request_id)
            except Exception:  # noqa: BLE001
                logger.exception("abort of %s failed during shutdown", request_id)
        self._engine_request_ids.clear()

    def _die(self, exc: BaseException) -> None:
        logger.error("engine loop failed; the engine is dead", exc_info=exc)
        self._dead = _dead_error(exc)
        self._abort_remaining()  # best effort: frees the blocks of a still usable engine
        try:
            self._loop.call_soon_threadsafe(self._after_death)
        except RuntimeError:
            pass  # the event loop is already closed

    def _after_death(self) -> None:
        self._fail_all(self._dead)
        for callback in self._death_callbacks:
            callback()


def _settle(future: asyncio.Future, value, error: BaseException | None) -> None:
    if future.done():  # the caller went away
        return
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(error)


def _dead_error(exc: BaseException) -> EngineDeadError:
    """What clients read of why the engine died: the exception's type, or for a worker
    failure the line naming the rank and how it ended (our own words; a worker's
    traceback, which can hold paths, follows on later lines and stays in the log)."""
    if isinstance(exc, WorkerFailure):
        return EngineDeadError(f"the engine failed: {str(exc).splitlines()[0].rstrip(':')}; "
                               "it cannot serve requests (see the server log)")
    return EngineDeadError(f"the engine failed ({type(exc).__name__}) and cannot serve "
                           "requests; see the server log")


def _failure(reason: str) -> RequestFailedError:
    kind = ConstraintFailedError if reason == NO_CONTINUATION else RequestFailedError
    return kind(f"the request failed: {reason}")


def _first_token_at(output: RequestOutput, now: float) -> float:
    """The monotonic time of the request's first token: `now`, unless the engine says it
    came earlier (a final-only request's one output arrives at its end)."""
    first = output.metrics.get("first_token_time")
    if first is None:
        return now
    return now - max(0.0, time.time() - first)
