"""The output processor's own process (`output_processor="process"`; output_process.py
starts it): it holds the tokenizer and the requests' RequestOutputs state, takes the
engine's messages in the batches they were sent in, and answers each message with what the
engine needs to build its outputs: each output's text, token count, new logprobs and
finish, by row (the int the engine gave the request at NewRequest), not the outputs
themselves, whose prompt and token lists the engine holds already."""
import logging
import os
import queue
import signal
import sys
import threading
import traceback
from multiprocessing.connection import Connection

import numpy as np

from parashift.engine.detokenizer import PROMPT_CONTEXT_TOKENS
from parashift.engine.request_outputs import Forget, NewRequest, RequestOutputs, StepTokens

# messages, by their first field: (NEW, row, request_id, prompt tail, params,
# reports_every_step),
# (STEP, rows, token ids, logprobs, {row: finish}), (FAIL, Failure), (FORGET, request_id)
NEW, STEP, FAIL, FORGET = range(4)
# answer entries, by their first field: (OUTPUT, row, text, num_tokens, new logprobs or None,
# finish_reason, stop_reason); (UNDECODABLE, row, text, num_tokens, request_id, error) for a
# request whose text could not be made; (FAILED, row, text) for a FAIL message's request
OUTPUT, UNDECODABLE, FAILED = range(3)
# Below the engine loop's priority: on a busy host the loop's handing a step over does not
# yield the core to the child, which need only keep up (its outputs are not on the loop)
NICENESS = 10


class SeqView:
    """The fields of a request's Sequence that RequestOutputs reads (the engine rebuilds
    what the others give)."""
    __slots__ = ("request_id", "prompt", "prompt_token_ids", "params", "first_token_time",
                 "num_cached_tokens")

    def __init__(self, request_id: str, prompt_tail: list[int], params):
        self.request_id, self.prompt_token_ids, self.params = request_id, prompt_tail, params
        self.prompt, self.first_token_time, self.num_cached_tokens = None, None, 0


class ChildOutputs:
    """RequestOutputs behind the wire format: messages in, answers out."""

    def __init__(self, tokenizer):
        self.outputs = RequestOutputs(tokenizer)
        self._ids: dict[int, str] = {}   # request id by row
        self._rows: dict[str, int] = {}  # row by request id
        self._logprobs_sent: dict[str, int] = {}  # logprobs already answered, by request id
        self._delta: dict[str, bool] = {}  # the requests whose outputs are deltas

    def take(self, message: tuple):
        """The message's answer (outputs, ended, forgotten), or None where it has none."""
        kind = message[0]
        if kind == STEP:
            return self._step(*message[1:])
        if kind == NEW:
            self._new(*message[1:])
            return None
        if kind == FAIL:
            return self._answer(self.outputs.process(message[1]), failed=True)
        if kind == FORGET:
            return self._forget(message[1])
        raise TypeError(f"the output process got message kind {kind!r}")

    def _new(self, row: int, request_id: str, prompt_tail: list[int], params,
             reports_every_step: bool) -> None:
        if request_id in self._rows:  # placed again: it keeps its text (and its row)
            return
        self._ids[row], self._rows[request_id] = request_id, row
        if params.output_kind == "delta":
            self._delta[request_id] = True
        self.outputs.process(NewRequest(SeqView(request_id, prompt_tail, params),
                                        reports_every_step))

    def _step(self, rows: bytes, tokens: bytes, logprobs, finished: dict):
        ids = list(map(self._ids.get, np.frombuffer(rows, np.int64).tolist()))
        step = StepTokens(ids, np.frombuffer(tokens, np.int64).tolist(), logprobs,
                          {self._ids.get(row): finish for row, finish in finished.items()})
        return self._answer(self.outputs.process(step))

    def _forget(self, request_id: str):
        processed = self.outputs.process(Forget(request_id))
        self._drop(request_id)
        return [], {}, processed.forgotten

    def _answer(self, processed, failed: bool = False):
        return ([self._entry(output, failed) for output in processed.outputs],
                processed.ended, processed.forgotten)

    def _entry(self, output, failed: bool) -> tuple:
        request_id, completion = output.request_id, output.outputs[0]
        row = self._rows.get(request_id, -1)
        if failed:
            entry = FAILED, row, completion.text
        elif output.error is not None:
            entry = (UNDECODABLE, row, completion.text, len(completion.token_ids), request_id,
                     output.error)
        else:  # a delta output's logprobs are new already
            logprobs = (completion.logprobs if self._delta.get(request_id)
                        else self._new_logprobs(request_id, completion.logprobs))
            entry = (OUTPUT, row, completion.text, len(completion.token_ids), logprobs,
                     completion.finish_reason, completion.stop_reason)
        if output.finished:
            self._drop(request_id)
        return entry

    def _new_logprobs(self, request_id: str, logprobs: list | None) -> list | None:
        if logprobs is None:
            return None
        sent = self._logprobs_sent.get(request_id, 0)
        self._logprobs_sent[request_id] = len(logprobs)
        return logprobs[sent:]

    def _drop(self, request_id: str) -> None:
        row = self._rows.pop(request_id, None)
        self._ids.pop(row, None)
        self._logprobs_sent.pop(request_id, None)
        self._delta.pop(request_id, None)


def prompt_tail(prompt_token_ids: list[int]) -> list[int]:
    """What the detokenizer reads of a prompt."""
    return prompt_token_ids[-PROMPT_CONTEXT_TOKENS:]


def run(inbox: Connection, outbox: Connection) -> None:
    """The process's loop: the first message is the tokenizer; each batch of messages from
    `inbox` gives a list with one answer (or None) per message, sent on `outbox` by a thread
    of its own, so that a full pipe back never stops this loop from reading (the engine may
    be blocked sending). A batch that breaks the processor itself is answered by its
    traceback (a str). Ends on None or when the engine's end of `inbox` closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the engine's to handle
    logging.getLogger("parashift").setLevel(logging.ERROR)  # the engine logs the failures
    try:
        tokenizer = inbox.recv()
    except (EOFError, OSError):
        return
    os.nice(NICENESS)  # once started: a busy host does not hold its start-up back
    child, answers = ChildOutputs(tokenizer), queue.SimpleQueue()
    sender = threading.Thread(target=_send_answers, args=(answers, outbox), daemon=True)
    sender.start()
    while True:
        try:
            batch = inbox.recv()
        except (EOFError, OSError):
            break
        if batch is None:
            break
        answers.put(_answer_batch(child, batch))
    answers.put(None)
    sender.join()


def _answer_batch(child: ChildOutputs, batch: list[tuple]) -> list | str:
    try:
        return [child.take(message) for message in batch]
    except Exception:  # noqa: BLE001 - sent to the engine, which raises it
        return traceback.format_exc()


def _send_answers(answers: queue.SimpleQueue, outbox) -> None:
    """Sends what is queued in one message per wake-up."""
    while True:
        batch = [answers.get()]
        while not answers.empty():
            batch.append(answers.get())
        done = batch[-1] is None
        if done:
            batch.pop()
        try:
            if batch:
                outbox.send(batch)
        except OSError:  # the engine is gone
            return
        if done:
            outbox.close()
            return


if __name__ == "__main__":  # output_process.py starts it: its pipes' file descriptors
    run(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False))
