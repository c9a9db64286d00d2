"""The engine's side of speculative decoding: before a replica's step is scheduled, the
proposer drafts tokens for its decoding sequences (the scheduler takes them into their
chunks: a verification step is a step of 1 + k tokens a sequence); after it, each
verification's sampled tokens become the accepted ones, and the counts go to the stats."""
from dataclasses import dataclass, field

from parashift.spec_decode.config import SpeculativeConfig
from parashift.spec_decode.rejection import accepted_tokens

# A request whose draft was wholly rejected drafts again only after this many plain steps,
# doubled at each further miss (up to MAX_BACKOFF): where drafts do not pay, it decodes.
# Under async scheduling a proposal that finds nothing is a miss too (the request waited
# for its token to draft: a step of its own lost).
FIRST_BACKOFF, MAX_BACKOFF = 1, 16


@dataclass
class SpecDecodeStats:
    """Counts since start-up (vLLM's names): verification steps of a sequence with a
    draft, draft tokens, accepted ones, and accepted ones by draft position."""
    method: str
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a verification step gives a sequence: its accepted drafts and one more."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0


class _Backoff:
    """`resume_at`: the token count (pending tokens included) from which it drafts again."""
    __slots__ = ("resume_at", "wait")

    def __init__(self):
        self.resume_at, self.wait = 0, FIRST_BACKOFF


class Speculator:

    def __init__(self, config: SpeculativeConfig, proposer):
        self.config, self.proposer = config, proposer
        self.k = config.num_speculative_tokens
        self.stats = SpecDecodeStats(config.method, accepted_per_position=[0] * self.k)
        self._backoff: dict[str, _Backoff] = {}

    def propose(self, scheduler, allowed, ahead: bool = False) -> None:
        """Drafts for the scheduler's running sequences that decode next (no token on its
        way), at most k tokens and never past the sequence's length limit; `allowed(seq,
        draft)`: the draft cut where the request's constraints (a grammar) refuse it.
        `ahead`: the step is scheduled while another runs (async scheduling): a sequence
        that would draft but has a token on its way waits for it (`scheduler.deferred`)
        instead of taking a placeholder."""
        drafting, items, deferred = [], [], set()
        for seq in scheduler.running:
            seq.spec_token_ids = []
            tokens, pending = seq.token_ids, seq.num_pending_tokens
            end = len(tokens) + pending
            room = min(self.k, seq.length_limit - end - 1)
            if (room <= 0 or seq.num_computed_tokens != end - 1
                    or self._backing_off(seq.request_id, end)):
                continue
            if pending:
                if ahead:
                    deferred.add(seq)
                continue
            drafting.append(seq)
            items.append((seq.request_id, tokens, room))
        drafted = 0
        for seq, (_, _, room), draft in zip(drafting, items,
                                            self.proposer.propose_all(items) if items else ()):
            if draft:
                seq.spec_token_ids = allowed(seq, list(draft[:room]))
                drafted += len(seq.spec_token_ids)
            if ahead and not seq.spec_token_ids:
                self._miss(seq.request_id, len(seq.token_ids) + 1)
        scheduler.draft_tokens, scheduler.deferred = drafted, deferred

    def _backing_off(self, request_id: str, end: int) -> bool:
        backoff = self._backoff.get(request_id)
        return backoff is not None and end < backoff.resume_at

    def _miss(self, request_id: str, tokens_after: int) -> None:
        """A draft wholly rejected (or, ahead, none found): plain steps until the request
        holds `tokens_after` + its wait tokens, the wait doubled for the next miss."""
        backoff = self._backoff.get(request_id)
        if backoff is None:
            backoff = self._backoff[request_id] = _Backoff()
        backoff.resume_at = tokens_after + backoff.wait
        backoff.wait = min(2 * backoff.wait, MAX_BACKOFF)

    def verify(self, sched, tokens: list[int], logprobs: list | None):
        """A step's sampled rows (one per sampling chunk, 1 + k per verification) as the
        scheduler takes them: a list of accepted tokens for each verification, with each
        sampling chunk's logprobs (a list for a verification)."""
        rows, row_logprobs, i = [], [] if logprobs is not None else None, 0
        for s in sched.scheduled:
            if not s.samples:
                continue
            if not s.draft:
                rows.append(tokens[i])
                if row_logprobs is not None:
                    row_logprobs.append(logprobs[i])
                i += 1
                continue
            m = len(s.draft) + 1
            accepted = accepted_tokens(s.draft, tokens[i:i + m])
            self._count(s.seq, s.draft, len(accepted) - 1)
            rows.append(accepted)
            if row_logprobs is not None:
                row_logprobs.append(logprobs[i:i + len(accepted)])
            i += m
        return rows, row_logprobs

    def _count(self, seq, draft: list[int], accepted: int) -> None:
        """A verification's counts (before its tokens are appended); a miss backs off."""
        stats = self.stats
        stats.num_drafts += 1
        stats.num_draft_tokens += len(draft)
        stats.num_accepted_tokens += accepted
        for position in range(accepted):
            stats.accepted_per_position[position] += 1
        if accepted:
            backoff = self._backoff.get(seq.request_id)
            if backoff is not None:
                backoff.wait = FIRST_BACKOFF
            return
        self._miss(seq.request_id, len(seq.token_ids) + 1)

    def finish(self, request_id: str, output_token_ids: list[int] | None = None) -> None:
        """The request left (finished, failed or aborted): its proposer state goes (a
        suffix proposer keeps a finished one's output in its global cache)."""
        self._backoff.pop(request_id, None)
        self.proposer.finish(request_id, output_token_ids or [])
