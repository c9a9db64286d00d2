"""The threads that compile structured-output grammars off the event loop.

A fixed number, all started together on the first compile and stopped with the app:
asyncio's default executor adds a thread whenever a job finds none idle and keeps it, so
a long-running server's thread count would depend on how many compiles ever overlapped
(the soak counts threads; docs/reliability.md)."""
import asyncio
import concurrent.futures
import queue
import threading


class CompileThreads:
    def __init__(self, count: int = 2, name: str = "parashift-grammar"):
        self.count, self.name = count, name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    async def run(self, fn, *args):
        """`fn(*args)` on one of the threads; its result or its exception."""
        self._start()
        future = concurrent.futures.Future()
        self._jobs.put((future, fn, args))
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        """Stops the threads once the jobs queued before have run."""
        with self._lock:
            threads, self._threads = self._threads, []
        for _ in threads:
            self._jobs.put(None)
        for thread in threads:
            thread.join(timeout=5)

    @property
    def alive(self) -> int:
        return sum(thread.is_alive() for thread in self._threads)

    def _start(self) -> None:
        with self._lock:
            if self._threads:
                return
            self._threads = [threading.Thread(target=self._serve, name=f"{self.name}-{i}",
                                              daemon=True) for i in range(self.count)]
            for thread in self._threads:
                thread.start()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn, args = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting request
                future.set_exception(exc)
