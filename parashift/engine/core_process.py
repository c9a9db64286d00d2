"""The engine core in a process of its own (`engine_core_process`), as vLLM v1 runs it. This
process holds the LLMEngine (its scheduler, executor and workers) and steps it while it has
work; its caller (core_client.py) makes the outputs, so detokenization, stop strings and
the RequestOutputs take no time of this loop.

The caller sends lists of commands, applied at step boundaries, in order:
  ("add", ticket, [(request_id, prompt, params, priority), ...], atomic)
      answered ("added", ticket, [error or None per request], stats); `atomic`: the first
      error aborts the requests of the list added before it
  ("abort", request_id)
  ("end", request_id, reason, stop_reason)  a request whose last output the caller made
  ("get", ticket, path) / ("call", ticket, path, args, kwargs)  the engine's attribute
      `path` (dotted), or its call, answered ("result", ticket, value, error); an attribute
      that is a method or cannot be pickled is answered CALLABLE or OBJECT
  ("stop",)
This process answers ("ready", facts) once the engine is built, then after every step, and
after commands that gave the caller something to make, ("step", messages, state): the
output processor's messages as tuples (forwarded by OutputForwarder) and the engine's state
(stats, step and transition records). ("dead", error, traceback) ends it."""
import logging
import os
import pickle
import queue
import sys
import threading
import traceback
from multiprocessing.connection import Connection

from parashift.engine.request_outputs import (Failure, Forget, NewRequest, Processed,
                                              StepTokens)

logger = logging.getLogger(__name__)

CALLABLE, OBJECT = "<callable>", "<object>"


class OutputForwarder:
    """The engine core's output processor: each message goes to the caller as a tuple, with
    the next send; what the caller ended comes back through `end`. A request's first token
    time and cached prompt tokens go with the step of its first token."""

    is_busy = False  # nothing is made here

    def __init__(self):
        self.unsent: list[tuple] = []
        self._fresh: dict[str, object] = {}  # placed requests whose first token has not gone
        self._ended: dict[str, tuple] = {}
        self._forgotten: list[str] = []
        self._done: list[str] = []

    def submit(self, message) -> None:
        if isinstance(message, StepTokens):
            self.unsent.append(("step", message.request_ids, message.token_ids,
                                message.logprobs, message.finished, self._firsts(),
                                message.prompt_logprobs))
            self._done += message.finished
        elif isinstance(message, NewRequest):
            seq = message.seq
            self._fresh[seq.request_id] = seq
            self.unsent.append(("new", seq.request_id, seq.prompt, seq.prompt_token_ids,
                                seq.params, message.reports_every_step))
        elif isinstance(message, Failure):
            self._fresh.pop(message.request_id, None)
            self.unsent.append(("fail", message))
            self._done.append(message.request_id)
        elif isinstance(message, Forget):
            self._fresh.pop(message.request_id, None)
            self.unsent.append(("forget", message.request_id))
            self._forgotten.append(message.request_id)
        else:
            raise TypeError(f"the output processor got a {type(message).__name__}")

    def end(self, request_id: str, reason: str, stop_reason) -> None:
        """The caller made the request's last output (a stop string it found)."""
        self._ended[request_id] = (reason, stop_reason)
        self._done.append(request_id)

    def take(self, wait: bool = False) -> list[Processed]:
        if not (self._ended or self._forgotten or self._done):
            return []
        processed = Processed(ended=self._ended, forgotten=self._forgotten, done=self._done)
        self._ended, self._forgotten, self._done = {}, [], []
        return [processed]

    def take_unsent(self) -> list[tuple]:
        unsent, self.unsent = self.unsent, []
        return unsent

    def close(self) -> None:
        pass

    def _firsts(self) -> dict[str, tuple]:
        if not self._fresh:
            return {}
        firsts = {request_id: (seq.first_token_time, seq.num_cached_tokens)
                  for request_id, seq in self._fresh.items() if seq.first_token_time is not None}
        for request_id in firsts:
            del self._fresh[request_id]
        return firsts


class Sender:
    """Sends on a thread of its own what the loop pickled, so that the loop reads its
    commands on while the caller is not reading (a full pipe either way cannot hold both
    processes up)."""

    def __init__(self, outbox: Connection):
        self._outbox = outbox
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="parashift-core-send",
                                        daemon=True)
        self._thread.start()

    def send(self, message) -> None:
        if self._failed is not None:
            raise BrokenPipeError("the caller has gone") from self._failed
        self._queue.put(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    def close(self, timeout: float = 10.0) -> None:
        """Sends what is queued, then stops."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while (data := self._queue.get()) is not None:
            try:
                self._outbox.send_bytes(data)
            except OSError as exc:
                self._failed = exc
                return


class EngineCore:
    """Steps the engine while it has work, applying the caller's commands between steps."""

    def __init__(self, engine, forwarder: OutputForwarder, inbox: Connection, outbox: Sender):
        self.engine, self.forwarder = engine, forwarder
        self.inbox, self.outbox = inbox, outbox
        self.num_commands = 0  # applied so far (the caller tells what it sent from this)
        self._faults = None
        self._stopping = False

    def run(self) -> None:
        engine = self.engine
        while not self._stopping:
            busy = engine.has_unfinished_requests()
            for commands in self._received(block=not busy):
                for command in commands:
                    self._apply(command)
            if self._stopping:
                return
            if engine.has_unfinished_requests() or self.forwarder.unsent:
                self.step()

    def step(self) -> None:
        """One engine step (none without work), its messages and state to the caller."""
        if self.engine.has_unfinished_requests():
            self.engine.step()
        self.outbox.send(("step", self.forwarder.take_unsent(), self._state()))

    def _received(self, block: bool) -> list:
        received = []
        if block:
            self.inbox.poll(None)  # (a caller that died ends the pipe: recv raises EOFError)
        while self.inbox.poll():
            received.append(self.inbox.recv())
        return received

    def _apply(self, command: tuple) -> None:
        self.num_commands += 1
        kind = command[0]
        if kind == "abort":
            self.engine.abort_request(command[1])
        elif kind == "end":
            self.forwarder.end(*command[1:])
        elif kind == "add":
            self._add(*command[1:])
        elif kind in ("get", "call"):
            self._answer(*command)
        elif kind == "stop":
            self._stopping = True
        else:
            raise ValueError(f"the engine core got an unknown command {kind!r}")

    def _add(self, ticket: int, requests: list[tuple], atomic: bool) -> None:
        errors = self.engine.add_requests(requests, atomic)
        self.outbox.send(("added", ticket, [None if e is None else describe_error(e)
                                            for e in errors], self.engine.stats()))

    def _answer(self, kind: str, ticket: int, path: str, args=(), kwargs=None) -> None:
        value, error = None, None
        try:
            target = self.engine
            for name in path.split("."):
                target = getattr(target, name)
            value = target(*args, **(kwargs or {})) if kind == "call" else _as_value(target)
            pickle.dumps(value)
        except Exception as exc:  # noqa: BLE001 - the caller gets it; the engine goes on
            value, error = None, describe_error(exc)
        self.outbox.send(("result", ticket, value, error))

    def _state(self) -> dict:
        engine = self.engine
        state = {"stats": engine.stats(), "unfinished": engine.has_unfinished_requests(),
                 "commands": self.num_commands, "steps": engine.take_step_records(),
                 "transitions": engine.take_transition_records()}
        if engine.seesaw:
            state["phase_seconds"] = engine.take_phase_seconds()
        if engine.faults is not self._faults:
            self._faults = state["faults"] = engine.faults
        return state


def _as_value(target):
    if callable(target):
        return CALLABLE
    try:
        pickle.dumps(target)
    except Exception:  # noqa: BLE001 - an executor, a scheduler: reached through calls
        return OBJECT
    return target


def describe_error(exc: BaseException) -> tuple[str, str]:
    """An exception as the caller rebuilds it (core_client.rebuilt_error): the name of its
    nearest built-in type, and its message (after its own type's name where that differs,
    but for a ValueError, the message a client of the server reads)."""
    builtin = next(t for t in type(exc).__mro__ if t.__module__ == "builtins")
    keep_text = builtin is type(exc) or issubclass(builtin, ValueError)
    return builtin.__name__, str(exc) if keep_text else f"{type(exc).__name__}: {exc}"


def main(inbox_fd: int, outbox_fd: int) -> int:
    from parashift.engine.llm_engine import LLMEngine
    inbox = Connection(inbox_fd, writable=False)
    outbox = Sender(Connection(outbox_fd, readable=False))
    config, offline, log_level = inbox.recv()
    logging.basicConfig(level=log_level, format="%(levelname)s %(name)s: %(message)s")
    try:
        forwarder = OutputForwarder()
        engine = LLMEngine(config, offline, output_processor=forwarder)
    except BaseException as exc:  # noqa: BLE001 - told to the caller, which raises it
        outbox.send(("dead", describe_error(exc), traceback.format_exc()))
        outbox.close()
        return 1
    code = 0
    try:
        outbox.send(("ready", _facts(engine)))
        EngineCore(engine, forwarder, inbox, outbox).run()
    except (BrokenPipeError, EOFError):  # the caller went away
        code = 1
    except BaseException as exc:  # noqa: BLE001 - the engine is dead: the caller is told
        logger.exception("the engine core failed")
        outbox.send(("dead", describe_error(exc), traceback.format_exc()))
        code = 1
    finally:
        engine.shutdown()
        outbox.close()
    return code


def _facts(engine) -> dict:
    """What the caller keeps of the engine: fixed at start-up."""
    return {"config": engine.config, "tokenizer": engine.tokenizer,
            "model_name": engine.model_name, "default_sampling": engine.default_sampling,
            "vocab_size": engine.vocab_size, "max_model_len": engine.max_model_len,
            "max_context": engine.max_context, "device": str(engine.device),
            "seesaw": tuple(engine.seesaw), "faults": engine.faults, "stats": engine.stats(),
            "pid": os.getpid()}


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
