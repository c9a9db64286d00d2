"""The requests' outputs, built from what the engine loop hands over: each request's tokens,
logprobs and text (detokenized in one batch per step), its stop strings, and its
RequestOutputs. Runs wherever the output processor runs it (output_processor.py); it
touches no engine state."""
import logging
from dataclasses import dataclass, field

from parashift.engine.prompt_logprobs import make_prompt_logprobs, token_texts_of
from parashift.engine.detokenizer import IncrementalDetokenizer, TokenTexts, append_all
from parashift.engine.sequence import Sequence
from parashift.outputs import CompletionOutput, RequestOutput

logger = logging.getLogger(__name__)

Finish = tuple[str, int | str | None]  # (finish_reason, stop_reason)


@dataclass
class NewRequest:
    """A request placed on a replica. Of `seq` only what is fixed by the time its first
    token is handed over is read: its id, prompt, params, first_token_time and
    num_cached_tokens."""
    seq: Sequence
    reports_every_step: bool


@dataclass
class StepTokens:
    """One step's sampled tokens, a request each, in the step's order; `logprobs` is None
    when the step computed none. `finished`: the requests the engine ended on their token."""
    request_ids: list[str]
    token_ids: list[int]
    logprobs: list | None
    finished: dict[str, Finish]
    # the prompt logprobs of the requests whose prompt this step computed, by request id
    # (engine/prompt_logprobs.py's raw entries)
    prompt_logprobs: dict[str, list] | None = None


@dataclass
class Failure:
    """A request the engine failed (its ranks, its grammar, a lost group)."""
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    num_cached_tokens: int
    reason: str


@dataclass
class Forget:
    """An aborted request: no more outputs."""
    request_id: str


@dataclass
class Processed:
    """What one message gave: outputs, the requests ended here while the engine still runs
    them (by request id: ("stop", the stop string) or ("error", None)), the aborted
    requests forgotten, and the requests whose last output was made in another process
    (an engine core's, whose outputs its caller makes: core_process.py)."""
    outputs: list[RequestOutput] = field(default_factory=list)
    ended: dict[str, Finish] = field(default_factory=dict)
    forgotten: list[str] = field(default_factory=list)
    done: list[str] = field(default_factory=list)


class _RequestState:
    """What a request's outputs are made of. The request's fixed fields are copied here
    (its first output copies those fixed once it has a token): a step touches this object
    and its lists, not the Sequence the engine loop keeps changing."""
    __slots__ = ("seq", "detokenizer", "token_ids", "logprobs", "reports_every_step",
                 "request_id", "prompt", "prompt_token_ids", "wants_logprobs",
                 "first_token_time", "num_cached_tokens", "delta", "sent_chars", "sent_tokens",
                 "prompt_logprobs")

    def __init__(self, seq: Sequence, detokenizer: IncrementalDetokenizer | None,
                 reports_every_step: bool):
        self.seq = seq
        self.detokenizer = detokenizer
        self.token_ids: list[int] = []
        self.logprobs: list[dict[int, float]] = []
        self.reports_every_step = reports_every_step
        self.request_id, self.prompt = seq.request_id, seq.prompt
        self.prompt_token_ids = seq.prompt_token_ids
        self.wants_logprobs = seq.params.logprobs is not None
        self.first_token_time: float | None = None  # set with num_cached_tokens at 1st output
        self.num_cached_tokens = 0
        self.delta = seq.params.output_kind == "delta"  # outputs carry what is new only
        self.sent_chars = self.sent_tokens = 0  # what its delta outputs gave so far
        self.prompt_logprobs = None  # vLLM's shape, once its prompt is computed

    def take_prompt_logprobs(self):
        """Every output's prompt logprobs; a delta output's only once."""
        logprobs = self.prompt_logprobs
        if self.delta:
            self.prompt_logprobs = None
        return logprobs

    @property
    def text(self) -> str:
        return self.detokenizer.text if self.detokenizer is not None else ""

    @property
    def shown_text(self) -> str:
        """A running request's text: less a tail that may still become a stop string."""
        return self.detokenizer.shown_text() if self.detokenizer is not None else ""

    def take_delta(self, text: str) -> tuple[str, list[int], list | None]:
        """The text, tokens and logprobs new since the last delta output."""
        start, self.sent_tokens = self.sent_tokens, len(self.token_ids)
        new_text, self.sent_chars = text[self.sent_chars:], len(text)
        return (new_text, self.token_ids[start:],
                self.logprobs[start:] if self.wants_logprobs else None)

    def fix_first_token(self) -> None:
        """Copies what the request's first token fixed (the engine set both before it
        handed the token over)."""
        self.first_token_time = self.seq.first_token_time
        self.num_cached_tokens = self.seq.num_cached_tokens


class RequestOutputs:
    """Every live request's output state; `process` takes one message."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._states: dict[str, _RequestState] = {}
        self._token_texts = TokenTexts()

    def process(self, message) -> Processed:
        if isinstance(message, StepTokens):
            return self._take_step(message)
        if isinstance(message, NewRequest):
            self._add(message)
            return Processed()
        if isinstance(message, Failure):
            return Processed([self._error_output(message)])
        if isinstance(message, Forget):
            self._states.pop(message.request_id, None)
            return Processed(forgotten=[message.request_id])
        raise TypeError(f"the output processor got a {type(message).__name__}")

    def _add(self, message: NewRequest) -> None:
        """A request placed again (its group was lost) keeps the text it has."""
        seq = message.seq
        if seq.request_id in self._states:
            return
        detokenizer = (IncrementalDetokenizer(self.tokenizer, seq.prompt_token_ids, seq.params)
                       if self.tokenizer is not None else None)
        self._states[seq.request_id] = _RequestState(seq, detokenizer, message.reports_every_step)

    def _take_step(self, step: StepTokens) -> Processed:
        """Appends each request's token; decodes every new token in one batch, except one
        that an EOS or a stop token id ended (it gets no text); builds the outputs."""
        advanced, finishes, detokenizers, tokens, decoded = [], [], [], [], []
        states, finished, logprobs = self._states, step.finished, step.logprobs
        if step.prompt_logprobs:
            self._take_prompt_logprobs(step.prompt_logprobs)
        for i, (request_id, token) in enumerate(zip(step.request_ids, step.token_ids)):
            state = states.get(request_id)
            if state is None:  # ended here already, or aborted: its later tokens are dropped
                continue
            finish = finished.get(request_id) if finished else None
            state.token_ids.append(token)
            if logprobs is not None and logprobs[i] is not None:
                state.logprobs.append(logprobs[i])
            if state.detokenizer is not None and not (finish is not None and finish[0] == "stop"):
                decoded.append(len(advanced))
                detokenizers.append(state.detokenizer)
                tokens.append(token)
            advanced.append(state)
            finishes.append(finish)
        stops = [None] * len(advanced)
        if detokenizers:
            for k, stop in zip(decoded, append_all(detokenizers, tokens, self._token_texts)):
                stops[k] = stop
        processed = Processed()
        for state, finish, stop in zip(advanced, finishes, stops):
            self._report(state, finish, stop, processed)
        return processed

    def _take_prompt_logprobs(self, computed: dict[str, list]) -> None:
        decode = token_texts_of(self.tokenizer)
        for request_id, raw in computed.items():
            state = self._states.get(request_id)
            if state is not None:
                state.prompt_logprobs = make_prompt_logprobs(state.prompt_token_ids, raw, decode)

    def _report(self, state: _RequestState, finish: Finish | None,
                stop: str | Exception | None, processed: Processed) -> None:
        """A request whose output cannot be made (its text cannot be decoded) fails alone."""
        request_id = state.request_id
        try:
            if isinstance(stop, Exception):
                raise stop
            output = self._output(state, finish, stop)
        except Exception as exc:  # noqa: BLE001 - e.g. its text cannot be decoded
            logger.exception("the output of request %s could not be made", request_id)
            self._states.pop(request_id, None)
            seq = state.seq
            processed.outputs.append(self._error_output(Failure(
                request_id, seq.prompt, seq.prompt_token_ids, state.token_ids,
                seq.num_cached_tokens, f"{type(exc).__name__}: {exc}")))
            if finish is None:
                processed.ended[request_id] = ("error", None)
            return
        if output is None:
            return
        processed.outputs.append(output)
        if output.finished:
            self._states.pop(request_id, None)
            if finish is None:  # a stop string the engine has not seen
                processed.ended[request_id] = ("stop", stop)

    def _output(self, state: _RequestState, finish: Finish | None, stop: str | None
                ) -> RequestOutput | None:
        """`stop`: the stop string the request's new token completed (it wins over a
        length finish on the same token). None for a request that asked for its final
        output only and goes on."""
        reason, stop_reason = ("stop", stop) if stop is not None else finish or (None, None)
        if reason is None and not state.reports_every_step:
            return None
        if state.first_token_time is None:
            state.fix_first_token()
        text = state.text if reason is not None else state.shown_text
        if state.delta:
            completion = CompletionOutput(0, *state.take_delta(text), reason, stop_reason)
        else:
            completion = CompletionOutput(
                0, text, state.token_ids[:],
                state.logprobs[:] if state.wants_logprobs else None, reason, stop_reason)
        # a final-only request's one output still tells the server when its first token came
        return RequestOutput(state.request_id, state.prompt, state.prompt_token_ids,
                             [completion], reason is not None, state.num_cached_tokens,
                             {"first_token_time": state.first_token_time},
                             prompt_logprobs=state.take_prompt_logprobs())

    def _error_output(self, failure: Failure) -> RequestOutput:
        """The request's last output, with finish reason "error"; its state goes."""
        logger.warning("request %s failed: %s", failure.request_id, failure.reason)
        state = self._states.pop(failure.request_id, None)
        text, token_ids = state.text if state is not None else "", list(failure.output_token_ids)
        if state is not None and state.delta:  # what its outputs have not given yet
            text, token_ids = text[state.sent_chars:], token_ids[state.sent_tokens:]
        completion = CompletionOutput(0, text, token_ids, None, "error", None)
        return RequestOutput(failure.request_id, failure.prompt, failure.prompt_token_ids,
                             [completion], True, failure.num_cached_tokens, error=failure.reason)
