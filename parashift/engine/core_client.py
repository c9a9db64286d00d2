"""The caller's side of an engine core in a process of its own (`engine_core_process`;
core_process.py runs the core): the LLMEngine interface that `LLM` and the server use. The
core steps while it has work and sends each step's tokens; this process makes them into
RequestOutputs (detokenization and stop strings: request_outputs.py, inline) and folds
parallel samples, so the core's loop does neither (vLLM v1's split of its frontend and
engine core). An attribute of the engine not kept here is asked of the core (an RPC at its
next step boundary)."""
import builtins
import collections
import itertools
import logging
import os
import weakref

from parashift.config import EngineConfig
from parashift.engine.child_process import receive, start_child, stop_child
from parashift.engine.core_process import CALLABLE, OBJECT
from parashift.engine.output_child import SeqView
from parashift.engine.parallel_sampling import ParentRequest, fold_children
from parashift.engine.request_outputs import (Forget, NewRequest, Processed, RequestOutputs,
                                              StepTokens)
from parashift.engine.startup import resolve_device
from parashift.gc_tuning import restore_garbage_collector, tune_garbage_collector
from parashift.outputs import RequestOutput
from parashift.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

RECORDS_KEPT = 10_000  # as the engine keeps its step and transition records


def make_engine(config: EngineConfig, offline: bool = False):
    """The engine the entry points drive: in this process, or its core in another."""
    if wants_core_process(config, offline, resolve_device(config.device).type,
                          os.cpu_count() or 1):
        return EngineCoreClient(config, offline)
    from parashift.engine.llm_engine import LLMEngine
    return LLMEngine(config, offline)


def wants_core_process(config: EngineConfig, offline: bool, device_type: str,
                       cores: int) -> bool:
    """`engine_core_process`, or where it is None: the server's core in a process of its own
    on a GPU host with cores to spare for it, as vLLM runs it (on one H200 it served the
    `chat` workload's streams 1.10x as fast, docs/benchmark_log.md); not the offline LLM's
    (its outputs are final-only: equal throughput measured), nor where outputs are asked for
    on a thread or in an output process."""
    if config.engine_core_process is not None:
        return config.engine_core_process
    return (not offline and device_type == "cuda" and cores >= 4 and config.nnodes == 1
            and config.output_processor in ("auto", "inline"))


class CoreOutputs:
    """The engine core's step messages made into RequestOutputs (no pipes: the client's,
    and a benchmark's): each request's detokenization and stop strings, parallel samples
    folded, and which requests are owed a final output. `send` takes the commands this
    makes for the core ("end" of a request whose stop string is found here, "abort" of
    the children of a request whose last output is made)."""

    def __init__(self, tokenizer, send):
        self._outputs = RequestOutputs(tokenizer)
        self._send = send
        self._fresh: dict[str, SeqView] = {}  # requests placed, first token not yet come
        self.owed: set[str] = set()  # requests whose final output has not been returned
        self._parents: dict[str, ParentRequest] = {}  # requests with n or best_of > 1
        self._parent_of: dict[str, ParentRequest] = {}  # by child request id

    def added(self, request_id: str, params: SamplingParams, priority: int) -> None:
        """A request the core took."""
        self.owed.add(request_id)
        if params.num_samples > 1:
            parent = self._parents[request_id] = ParentRequest(request_id, params, priority)
            self._parent_of.update((child, parent) for child in parent.child_ids)

    def forget(self, request_id: str) -> None:
        """An aborted request: none of its outputs is made after this."""
        self.owed.discard(request_id)
        parent = self._parents.pop(request_id, None)
        for child in parent.child_ids if parent is not None else (request_id,):
            self._parent_of.pop(child, None)
            self._outputs.process(Forget(child))
            self._fresh.pop(child, None)

    def make(self, messages: list[tuple]) -> list[RequestOutput]:
        """The outputs of one core step's messages (one per request, as the engine's step
        gives them)."""
        outputs = []
        for message in messages:
            outputs += self._made(message)
        if self._parent_of:
            outputs = fold_children(outputs, self._parent_of, self._parents, self._end_parent)
        for output in outputs:
            if output.finished:
                self.owed.discard(output.request_id)
        return outputs

    def _made(self, message: tuple) -> list[RequestOutput]:
        kind = message[0]
        if kind == "step":
            _, request_ids, token_ids, logprobs, finished, firsts, *prompt_logprobs = message
            for request_id, (first_token_time, num_cached_tokens) in firsts.items():
                seq = self._fresh.pop(request_id, None)
                if seq is not None:
                    seq.first_token_time, seq.num_cached_tokens = first_token_time, \
                        num_cached_tokens
            processed = self._outputs.process(StepTokens(request_ids, token_ids, logprobs,
                                                         finished, *prompt_logprobs))
        elif kind == "new":
            _, request_id, prompt, prompt_token_ids, params, every_step = message
            if not self._is_live(request_id):
                return []  # aborted before the core placed it: the core forgets it next
            seq = self._fresh[request_id] = SeqView(request_id, prompt_token_ids, params)
            seq.prompt = prompt
            processed = self._outputs.process(NewRequest(seq, every_step))
        elif kind == "fail":
            processed = self._outputs.process(message[1])
            self._fresh.pop(message[1].request_id, None)
        else:  # "forget": the core aborted it (as asked here)
            processed = self._outputs.process(Forget(message[1]))
            self._fresh.pop(message[1], None)
        return self._taken(processed)

    def _taken(self, processed: Processed) -> list[RequestOutput]:
        """The outputs of live requests; a stop string found here ends its request in the
        core too."""
        for request_id, (reason, stop_reason) in processed.ended.items():
            if self._is_live(request_id):
                self._send(("end", request_id, reason, stop_reason))
        return [output for output in processed.outputs if self._is_live(output.request_id)]

    def _is_live(self, request_id: str) -> bool:
        return request_id in self.owed or request_id in self._parent_of

    def _end_parent(self, request_id: str) -> None:
        """A request of several samples whose last output is made: its children still
        running (one failed) end in the core."""
        parent = self._parents.pop(request_id)
        for child in parent.child_ids:
            self._parent_of.pop(child, None)
        self._send(("abort", request_id))



class EngineCoreClient:
    def __init__(self, config: EngineConfig, offline: bool = False):
        self._collector_tuned = False
        self._process, self._to_core, self._from_core = start_child(
            "parashift.engine.core_process")
        self._finalizer = weakref.finalize(self, _stop_core, self._process, self._to_core,
                                           self._from_core)
        self._broken: str | None = None
        self._steps: collections.deque = collections.deque()  # step messages not yet made
        self._answers: dict[int, tuple] = {}  # by ticket
        self._tickets = itertools.count()
        self._num_commands = 0  # sent to the core
        self._references: set[str] = set()  # the core engine's methods and objects, by path
        self._to_core.send((config, offline, logging.getLogger("parashift").getEffectiveLevel()))
        facts = self._wait_for("ready")[1]
        self.config: EngineConfig = facts["config"]
        self.tokenizer = facts["tokenizer"]
        self.model_name = facts["model_name"]
        self.default_sampling = facts["default_sampling"]
        self.vocab_size, self.max_model_len = facts["vocab_size"], facts["max_model_len"]
        self.max_context, self.device = facts["max_context"], facts["device"]
        self.seesaw = facts["seesaw"]  # the seesaw groups' ranks (truthy under seesaw)
        self.faults, self._stats = facts["faults"], facts["stats"]
        self.core_pid = facts["pid"]
        self._outputs = CoreOutputs(self.tokenizer, self._send)
        self._step_records = collections.deque(maxlen=RECORDS_KEPT)
        self._transition_records = collections.deque(maxlen=RECORDS_KEPT)
        self._phase_seconds: collections.Counter = collections.Counter()
        # this process makes an output per request and step: the collector as the engine's
        tune_garbage_collector()
        self._collector_tuned = True

    # ---- requests ------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    priority: int = 0) -> None:
        error = self.add_requests([(request_id, prompt, params, priority)])[0]
        if error is not None:
            raise error

    def add_requests(self, requests: list[tuple], atomic: bool = False
                     ) -> list[Exception | None]:
        """Hands requests `(request_id, prompt, params, priority)` over in one message; each
        one's error (None: taken). `atomic`: the first error takes back those before it, and
        the list ends there."""
        ticket = self._send_ticketed("add", requests, atomic)
        _, _, answers, self._stats = self._wait_for("added", ticket)
        errors = [None if answer is None else rebuilt_error(answer) for answer in answers]
        if not (atomic and any(errors)):  # (atomic: the core took back those before)
            for (request_id, _, params, priority), error in zip(requests, errors):
                if error is None:
                    self._outputs.added(request_id, params, priority)
        return errors

    def abort_request(self, request_id: str) -> None:
        """No output of the request comes after this call."""
        self._outputs.forget(request_id)
        self._send(("abort", request_id))

    def has_unfinished_requests(self) -> bool:
        """A request is unfinished until its final output has been returned."""
        return bool(self._outputs.owed)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        from parashift.engine.llm_engine import LLMEngine
        return LLMEngine.apply_chat_template(self, messages)

    # ---- the step ------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """The outputs of the core's steps that have come, waiting for one while a request
        is unfinished."""
        self._read(wait=bool(self._outputs.owed) and not self._steps)
        outputs, state = [], None
        while self._steps:  # a core step's outputs at a time (one per request)
            messages, state = self._steps.popleft()
            self._take_state(state)
            outputs += self._outputs.make(messages)
        if state is not None:
            self._check_nothing_lost(state)
        return outputs

    def _take_state(self, state: dict) -> None:
        self._stats = state["stats"]
        self._step_records.extend(state["steps"])
        self._transition_records.extend(state["transitions"])
        self._phase_seconds.update(state.get("phase_seconds", {}))
        self.faults = state.get("faults", self.faults)

    def _check_nothing_lost(self, state: dict) -> None:
        """The core has seen every command and holds no request, yet one is owed here."""
        owed = self._outputs.owed
        if not state["unfinished"] and state["commands"] == self._num_commands and owed:
            self._broken = (f"the engine core holds none of {len(owed)} unfinished "
                            f"request(s) (e.g. {next(iter(owed))!r})")
            raise RuntimeError(self._broken)

    # ---- what the server reads ---------------------------------------------------
    def stats(self):
        """As of the core's last step (or the last requests handed over)."""
        return self._stats

    def take_step_records(self) -> list:
        records = list(self._step_records)
        self._step_records.clear()
        return records

    def take_transition_records(self) -> list:
        records = list(self._transition_records)
        self._transition_records.clear()
        return records

    def take_phase_seconds(self) -> dict[str, float]:
        seconds, self._phase_seconds = dict(self._phase_seconds), collections.Counter()
        return seconds

    def check_health(self) -> None:
        self._check_usable()
        self._call("check_health")

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return _remote(self, name)

    # ---- the pipes -----------------------------------------------------------
    def _call(self, path: str, *args, **kwargs):
        ticket = self._send_ticketed("call", path, args, kwargs)
        return _result(self._wait_for("result", ticket))

    def _get(self, path: str):
        return _result(self._wait_for("result", self._send_ticketed("get", path)))

    def _send_ticketed(self, kind: str, *fields) -> int:
        ticket = next(self._tickets)
        self._send((kind, ticket, *fields))
        return ticket

    def _send(self, command: tuple) -> None:
        self._check_usable()
        try:
            self._to_core.send([command])
        except OSError:
            raise self._died() from None
        self._num_commands += 1

    def _wait_for(self, kind: str, ticket: int | None = None) -> tuple:
        """The core's answer `kind` (to `ticket`); step messages that come first are kept."""
        while True:
            if ticket is not None and ticket in self._answers:
                return self._answers.pop(ticket)
            message = self._receive()
            if message[0] == kind and (ticket is None or message[1] == ticket):
                return message
            self._keep(message)

    def _read(self, wait: bool) -> None:
        """Takes what the core has sent; with `wait`, at least one step message."""
        while wait and not self._steps:
            self._keep(self._receive())
        while self._from_core.poll():
            self._keep(self._receive())

    def _keep(self, message: tuple) -> None:
        if message[0] == "step":
            self._steps.append(message[1:])
        elif message[0] in ("added", "result"):
            self._answers[message[1]] = message
        elif message[0] == "dead":  # its error as raised here (a bad option a ValueError)
            self._broken = f"the engine core failed: {message[1][0]}: {message[1][1]}"
            logger.error("the engine core failed:\n%s", message[2])
            raise rebuilt_error(message[1])
        else:
            raise RuntimeError(f"the engine core sent an unknown message {message[0]!r}")

    def _receive(self) -> tuple:
        self._check_usable()
        try:
            return receive(self._process, self._from_core)
        except EOFError:
            raise self._died() from None

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise RuntimeError(self._broken)

    def _died(self) -> RuntimeError:
        stop_child(self._process, timeout=1)
        self._broken = (f"the engine core's process died (exit code "
                        f"{self._process.returncode})")
        return RuntimeError(self._broken)

    def shutdown(self) -> None:
        """Stops the core (its workers with it); idempotent."""
        if self._broken is None:
            self._broken = "the engine was shut down"
        self._finalizer()
        if self._collector_tuned:
            self._collector_tuned = False
            restore_garbage_collector()


def _stop_core(process, to_core, from_core) -> None:
    try:
        to_core.send([("stop",)])
    except OSError:
        pass
    # the core's message in flight is read so that a full pipe cannot hold it up
    try:
        while process.poll() is None and from_core.poll(0.05):
            from_core.recv()
    except (EOFError, OSError):
        pass
    stop_child(process, timeout=60)
    to_core.close()
    from_core.close()


class _Remote:
    """An attribute of the core's engine that is a method or an object (its executor,
    a scheduler): calls and attributes of it are asked of the core."""

    def __init__(self, client: EngineCoreClient, path: str):
        self._client, self._path = client, path

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return _remote(self._client, f"{self._path}.{name}")

    def __call__(self, *args, **kwargs):
        return self._client._call(self._path, *args, **kwargs)


def _remote(client: EngineCoreClient, path: str):
    """The core engine's attribute `path`: its value, or a reference to it (a method or an
    object; a reference, once known, is not asked for again)."""
    if path in client._references:
        return _Remote(client, path)
    value = client._get(path)
    if isinstance(value, str) and value in (CALLABLE, OBJECT):
        client._references.add(path)
        return _Remote(client, path)
    return value


def _result(answer: tuple):
    _, _, value, error = answer
    if error is not None:
        raise rebuilt_error(error)
    return value


def rebuilt_error(error: tuple[str, str]) -> Exception:
    """The core's error (core_process.describe_error) as an exception of this process: of
    the same built-in type (a ValueError is the request's fault), else a RuntimeError."""
    kind, text = error
    cls = getattr(builtins, kind, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        return cls(text)
    return RuntimeError(f"{kind}: {text}")
