"""The output processor: the requests' detokenization, stop strings and RequestOutputs
(request_outputs.py) off the engine loop, as vLLM v1's output processor does.

The engine loop hands over each step's sampled tokens (and new, failed and aborted
requests) as messages; a thread of their own turns them into outputs, in the order
handed over, while the loop goes on with the next step. The loop takes what is ready at
its step boundaries. "inline" runs each message as it is handed over, on the loop;
"process" runs them in a process of their own (output_process.py)."""
import os
import queue
import threading

from parashift.engine.request_outputs import Processed, RequestOutputs

_STOP = object()


def make_output_processor(tokenizer, mode: str, device_type: str = "cpu"):
    """The output processor of `mode` (EngineConfig.output_processor)."""
    if mode == "auto":
        mode = auto_mode(tokenizer, device_type, os.cpu_count() or 1)
    if mode == "process":
        from parashift.engine.output_process import OutputProcess
        return OutputProcess(tokenizer)
    return OutputProcessor(tokenizer, mode)


def auto_mode(tokenizer, device_type: str, cores: int) -> str:
    """A process of its own where there are texts to make, a core to spare for it and a GPU
    step to hide it behind: on an H200 host it cut the loop's host work per sequence from
    12.8 to 7.7 µs at 1024 sequences and from 12.5 to 9.2 at 256 (docs/benchmark_log.md,
    twelfth session); on two busy CPU cores it lost at 64 and 256."""
    return "process" if tokenizer is not None and device_type == "cuda" and cores >= 4 else "inline"


class OutputProcessor:
    def __init__(self, tokenizer, mode: str = "thread"):
        self._outputs = RequestOutputs(tokenizer)
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self._num_pending = 0  # messages handed over whose results the engine has not taken
        self._inbox: queue.SimpleQueue | None = None
        self._thread: threading.Thread | None = None
        self._handing_over = threading.Lock()  # a close (a finalizer's) against a submit
        if mode == "thread":
            self._inbox = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._run, args=(self._inbox,),
                                            name="parashift-outputs", daemon=True)
            self._thread.start()

    @property
    def is_busy(self) -> bool:
        """Messages were handed over whose results have not been taken."""
        return self._num_pending > 0

    def submit(self, message) -> None:
        with self._handing_over:
            self._num_pending += 1
            if self._inbox is None:
                self._results.put(_process(self._outputs, message))
            else:
                self._inbox.put(message)

    def take(self, wait: bool = False) -> list[Processed]:
        """The results ready, in the order their messages were handed over; with `wait`,
        every message's. Raises what broke the processor itself (not one request)."""
        taken = []
        while self._num_pending:
            try:
                result = self._results.get(block=wait)
            except queue.Empty:
                break
            self._num_pending -= 1
            if isinstance(result, BaseException):
                raise RuntimeError("the output processor failed") from result
            taken.append(result)
        return taken

    def close(self) -> None:
        """Stops the thread once it has taken what was handed over; an engine used after
        its shutdown (tests do) gets its outputs made inline."""
        with self._handing_over:
            if self._thread is None:
                return
            self._inbox.put(_STOP)
            self._thread.join()
            self._thread = self._inbox = None

    def _run(self, inbox: queue.SimpleQueue) -> None:
        while True:
            message = inbox.get()
            if message is _STOP:
                return
            self._results.put(_process(self._outputs, message))


def _process(outputs: RequestOutputs, message) -> Processed | BaseException:
    try:
        return outputs.process(message)
    except Exception as exc:  # noqa: BLE001 - handed to the engine loop, which raises it
        return exc
