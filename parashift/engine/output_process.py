"""The output processor in a process of its own (`output_processor="process"`), as vLLM v1
keeps detokenization off its engine core: the child (output_child.py, a fresh interpreter,
as spawn starts) holds the tokenizer and the RequestOutputs state, and the engine loop's share is a cheap
hand-over and the outputs' assembly.

A request gets a row (an int) at NewRequest; a step goes over as numpy arrays of rows and
token ids, its finishes by row and its logprobs, in one pipe message per step together with
the messages handed over since the last one. The child answers each message with the
outputs' texts, token counts, new logprobs and finishes, by row; the outputs are built here
from the request's Sequence (its prompt and token lists, which this process holds already).
The same interface as OutputProcessor: submit, take, is_busy, close."""
import collections
import itertools
import subprocess
import threading

import numpy as np

from parashift.engine import output_child
from parashift.engine.child_process import receive, start_child, stop_child
from parashift.engine.detokenizer import rust_backend
from parashift.engine.output_child import FAILED, OUTPUT, FAIL, FORGET, NEW, STEP
from parashift.engine.prompt_logprobs import make_prompt_logprobs, token_texts_of
from parashift.engine.request_outputs import (Failure, Forget, NewRequest, Processed,
                                              StepTokens, logger)
from parashift.engine.sequence import Sequence
from parashift.outputs import CompletionOutput, RequestOutput


class _Record:
    """What the outputs of a request with a row are built from."""
    __slots__ = ("seq", "row", "logprobs", "metrics", "num_cached_tokens", "delta",
                 "sent_tokens", "prompt_logprobs")

    def __init__(self, seq: Sequence, row: int):
        self.seq, self.row = seq, row
        self.logprobs: list = []
        self.metrics: dict | None = None  # its first token's time, fixed at its first output
        self.num_cached_tokens = 0
        self.delta = seq.params.output_kind == "delta"  # the child answers what is new only
        self.sent_tokens = 0  # the output tokens its delta outputs gave so far
        self.prompt_logprobs = None  # made here once its prompt is computed


class OutputProcess:
    def __init__(self, tokenizer):
        self._process, self._to_child, self._from_child = start_child(
            "parashift.engine.output_child")
        self._next_row = itertools.count()
        self._rows: dict[str, int] = {}  # by request id, the requests handed over
        self._records: dict[int, _Record] = {}  # by row
        self._failures: collections.deque[Failure] = collections.deque()  # FAILs unanswered
        self._forgetting: collections.deque[int] = collections.deque()  # FORGETs' rows
        self._unsent: list[tuple] = []
        self._num_pending = 0  # messages handed over whose answers have not been taken
        self._broken: str | None = None  # why the child can no longer be used
        self._handing_over = threading.Lock()  # a close (a finalizer's) against a submit
        self._tokenizer = tokenizer  # the prompt logprobs' texts are made here
        # the tokenizer's Rust backend where it has one (the child need not import transformers)
        try:
            self._to_child.send(rust_backend(tokenizer) or tokenizer if tokenizer is not None
                                else None)
        except OSError:  # it could not start
            raise self._died() from None

    @property
    def is_busy(self) -> bool:
        """Messages were handed over whose results have not been taken."""
        return self._num_pending > 0

    def submit(self, message) -> None:
        with self._handing_over:
            self._check_usable()
            self._unsent.append(self._encode(message))
            self._num_pending += 1
            if isinstance(message, StepTokens):
                self._send()

    def take(self, wait: bool = False) -> list[Processed]:
        """The results ready, in the order their messages were handed over; with `wait`,
        every message's. Raises what broke the processor, or that its process died."""
        with self._handing_over:
            self._check_usable()
            if self._unsent:
                self._send()
        taken = []
        while self._num_pending and (wait or self._from_child.poll()):
            for answers in self._receive():
                if isinstance(answers, str):
                    self._broken = "the output processor failed"
                    raise RuntimeError(f"the output processor failed:\n{answers}")
                self._num_pending -= len(answers)
                taken += [self._processed(answer) for answer in answers if answer is not None]
        return taken

    def close(self) -> None:
        """Stops the child once it has answered what was handed over (the answers are
        dropped) and joins it; an engine used after its shutdown gets a clear error."""
        with self._handing_over:
            if self._broken == "closed":
                return
            try:
                self._to_child.send(None)
            except OSError:
                pass
            stop_child(self._process, timeout=10)
            self._to_child.close()
            self._from_child.close()
            self._broken = "closed"

    # ---- the hand-over -------------------------------------------------------------
    def _encode(self, message) -> tuple:
        if isinstance(message, StepTokens):
            return self._encode_step(message)
        if isinstance(message, NewRequest):
            seq = message.seq
            row = self._rows.get(seq.request_id)
            if row is None:
                row = self._rows[seq.request_id] = next(self._next_row)
                self._records[row] = _Record(seq, row)
            return (NEW, row, seq.request_id, output_child.prompt_tail(seq.prompt_token_ids),
                    seq.params, message.reports_every_step)
        if isinstance(message, Failure):
            self._failures.append(message)
            return FAIL, message
        if isinstance(message, Forget):
            # its record goes with the answer (its outputs on their way are built first)
            self._forgetting.append(self._rows.pop(message.request_id, -1))
            return FORGET, message.request_id
        raise TypeError(f"the output processor got a {type(message).__name__}")

    def _encode_step(self, step: StepTokens) -> tuple:
        if step.prompt_logprobs:
            self._make_prompt_logprobs(step.prompt_logprobs)
        rows, count = self._rows, len(step.request_ids)
        row_ids = np.fromiter(map(rows.get, step.request_ids, itertools.repeat(-1, count)),
                              np.int64, count)
        finished = {rows.get(request_id, -1): finish
                    for request_id, finish in step.finished.items()}
        return (STEP, row_ids.tobytes(), np.array(step.token_ids, np.int64).tobytes(),
                step.logprobs, finished)

    def _make_prompt_logprobs(self, computed: dict[str, list]) -> None:
        decode = token_texts_of(self._tokenizer)
        for request_id, raw in computed.items():
            record = self._records.get(self._rows.get(request_id, -1))
            if record is not None:
                record.prompt_logprobs = make_prompt_logprobs(record.seq.prompt_token_ids, raw,
                                                              decode)

    def _send(self) -> None:
        batch, self._unsent = self._unsent, []
        try:
            self._to_child.send(batch)
        except OSError:
            raise self._died() from None

    def _receive(self) -> list:
        try:
            return receive(self._process, self._from_child)
        except EOFError:
            raise self._died() from None

    def _check_usable(self) -> None:
        if self._broken == "closed":
            raise RuntimeError("the output processor was closed (the engine was shut down)")
        if self._broken is not None:
            raise RuntimeError(self._broken)

    def _died(self) -> RuntimeError:
        try:
            self._process.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass
        self._broken = (f"the output processor's process died (exit code "
                        f"{self._process.returncode}) with {self._num_pending} message(s) "
                        "handed over unanswered")
        return RuntimeError(self._broken)

    # ---- the answers ---------------------------------------------------------------
    def _processed(self, answer: tuple) -> Processed:
        entries, ended, forgotten = answer
        records, built, outputs = self._records, self._built, []
        append = outputs.append
        for entry in entries:
            append(built(records[entry[1]], *entry[2:]) if entry[0] == OUTPUT
                   else self._ended_output(*entry))
        processed = Processed(outputs, ended, forgotten)
        for _ in forgotten:
            self._records.pop(self._forgetting.popleft(), None)
        return processed

    def _ended_output(self, kind: int, row: int, text: str, *rest) -> RequestOutput:
        """The last output of a request that failed (FAILED) or whose text could not be made."""
        record = self._forget_row(row)
        sent = record.sent_tokens if record is not None and record.delta else 0
        if kind == FAILED:
            return _failed_output(self._failures.popleft(), text, sent)
        num_tokens, request_id, error = rest
        seq = record.seq
        return _error_output(request_id, seq.prompt, seq.prompt_token_ids,
                             _output_tokens(seq, num_tokens, sent), seq.num_cached_tokens, text,
                             error)

    def _built(self, record: _Record, text: str, num_tokens: int, new_logprobs: list | None,
               reason: str | None, stop_reason) -> RequestOutput:
        seq = record.seq
        if record.metrics is None:  # its first output: what is fixed from now on
            record.metrics = {"first_token_time": seq.first_token_time}
            record.num_cached_tokens = seq.num_cached_tokens
        start = seq.num_prompt_tokens
        if record.delta:
            start += record.sent_tokens
            record.sent_tokens += num_tokens
            logprobs = new_logprobs
        else:
            logprobs = None
            if new_logprobs is not None:
                record.logprobs += new_logprobs
                logprobs = record.logprobs[:]
        completion = CompletionOutput(0, text, seq.token_ids[start:start + num_tokens], logprobs,
                                      reason, stop_reason)
        if reason is not None:
            self._forget_row(record.row)
        prompt_logprobs = record.prompt_logprobs
        if record.delta:  # given once
            record.prompt_logprobs = None
        return RequestOutput(seq.request_id, seq.prompt, seq.prompt_token_ids, [completion],
                             reason is not None, record.num_cached_tokens, record.metrics.copy(),
                             prompt_logprobs=prompt_logprobs)

    def _forget_row(self, row: int) -> _Record | None:
        record = self._records.pop(row, None)
        if record is not None and self._rows.get(record.seq.request_id) == row:
            del self._rows[record.seq.request_id]
        return record


def _output_tokens(seq: Sequence, num_tokens: int, skip: int = 0) -> list[int]:
    """`num_tokens` output tokens after the first `skip` (the engine may have appended more
    since)."""
    start = seq.num_prompt_tokens + skip
    return seq.token_ids[start:start + num_tokens]


def _failed_output(failure: Failure, text: str, sent_tokens: int = 0) -> RequestOutput:
    """`sent_tokens`: the output tokens a delta request's outputs gave already."""
    return _error_output(failure.request_id, failure.prompt, failure.prompt_token_ids,
                         list(failure.output_token_ids[sent_tokens:]), failure.num_cached_tokens,
                         text, failure.reason)


def _error_output(request_id: str, prompt: str | None, prompt_token_ids: list[int],
                  token_ids: list[int], num_cached_tokens: int, text: str,
                  reason: str) -> RequestOutput:
    """A request's last output, finish reason "error" (as RequestOutputs makes it)."""
    logger.warning("request %s failed: %s", request_id, reason)
    completion = CompletionOutput(0, text, token_ids, None, "error", None)
    return RequestOutput(request_id, prompt, prompt_token_ids, [completion], True,
                         num_cached_tokens, error=reason)
