"""A step with verifications (speculative decoding) as the output processor takes it: a
request may take several tokens, so the step goes as one StepTokens per token index (the
i-th new token of each request that took more than i), in order. The processor ends a
request at a stop string inside them and drops its later tokens, as at any step."""
from parashift.engine.request_outputs import Finish, StepTokens
from parashift.engine.sequence import Sequence, SequenceStatus


class VerifiedStep:
    """Made before the scheduler takes the step's tokens (each sampling sequence's token
    count then); `messages` after it, from what each sequence took."""

    def __init__(self, sampling: list[Sequence]):
        done = SequenceStatus.FINISHED
        self._taking = [(i, seq, len(seq.token_ids)) for i, seq in enumerate(sampling)
                        if seq.status is not done]
        self.finished: dict[str, Finish] = {}
        self.prompt_logprobs: dict[str, list] | None = None  # as StepTokens', by request

    def messages(self, logprobs: list | None) -> list[StepTokens]:
        """`logprobs`: per sampling chunk of the step (a list for a verification)."""
        rounds: list[StepTokens] = []
        for i, seq, before in self._taking:
            new = seq.token_ids[before:]
            row_logprobs = None if logprobs is None else logprobs[i]
            if row_logprobs is not None and not isinstance(row_logprobs, list):
                row_logprobs = [row_logprobs]
            for r, token in enumerate(new):
                if r == len(rounds):
                    rounds.append(StepTokens([], [], None if logprobs is None else [], {}))
                message = rounds[r]
                message.request_ids.append(seq.request_id)
                message.token_ids.append(token)
                if message.logprobs is not None:
                    message.logprobs.append(row_logprobs[r] if row_logprobs else None)
            finish = self.finished.get(seq.request_id)
            if finish is not None and new:
                rounds[len(new) - 1].finished[seq.request_id] = finish
        if self.prompt_logprobs:  # with a prompt's first token, in the first message
            if not rounds:
                rounds.append(StepTokens([], [], None if logprobs is None else [], {}))
            rounds[0].prompt_logprobs = self.prompt_logprobs
        return rounds
