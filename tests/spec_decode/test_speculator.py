"""The speculator's drafting rounds: who drafts, who waits for a token on its way (async
scheduling), and how misses back off."""
from parashift.spec_decode.config import SpeculativeConfig
from parashift.spec_decode.proposer import Proposer
from parashift.spec_decode.speculator import Speculator
from tests.engine.test_scheduler import make_scheduler, make_seq


class Scripted(Proposer):
    """Drafts by request id: the same draft at every call (none for unknown ids)."""

    def __init__(self, drafts: dict[str, list[int]]):
        self.drafts, self.calls = drafts, []

    def propose(self, request_id, tokens, k):
        self.calls.append(request_id)
        return self.drafts.get(request_id, [])

    def finish(self, request_id, output_token_ids):
        pass


def allow_all(seq, draft):
    return draft


def setup(drafts):
    sched = make_scheduler()
    seqs = [make_seq(name, 5, base=1000 * (i + 1)) for i, name in enumerate("ab")]
    for seq in seqs:
        sched.add(seq)
    speculator = Speculator(SpeculativeConfig(num_speculative_tokens=2), Scripted(drafts))
    return sched, speculator, seqs


def test_ahead_a_sequence_that_would_draft_waits_and_one_without_drafts_backs_off():
    sched, speculator, (a, b) = setup({"a": [7, 8]})
    first = sched.schedule()  # the prompts
    speculator.propose(sched, allow_all, ahead=True)  # first in flight: both would draft
    assert sched.deferred == {a, b} and speculator.proposer.calls == []
    assert sched.schedule().is_empty  # every row waits: the engine waits for the step
    sched.update(first, {"a": 50, "b": 60})
    speculator.propose(sched, allow_all, ahead=True)
    assert (a.spec_token_ids, b.spec_token_ids, sched.draft_tokens) == ([7, 8], [], 2)
    second = sched.schedule()  # a verifies; b found nothing: a miss, it decodes
    assert [(s.seq.request_id, s.num_samples) for s in second.scheduled] == [("a", 3), ("b", 1)]
    speculator.propose(sched, allow_all, ahead=True)  # second in flight
    assert sched.deferred == set()  # a's tokens unknown; b backs off: it decodes ahead
    third = sched.schedule()
    assert [(s.seq.request_id, s.start_pos) for s in third.scheduled] == [("b", 6)]
    rows, _ = speculator.verify(second, [9, 9, 9, 61], None)  # a's draft wholly rejected
    assert rows == [[9], 61]
    sched.update(second, rows)
    speculator.propose(sched, allow_all, ahead=True)  # third in flight
    assert sched.deferred == {b}  # its backoff (one plain step) is over
    assert a.spec_token_ids == []  # a's miss: one plain step before it drafts again
    assert speculator.stats.num_drafts == 1 and speculator.stats.num_accepted_tokens == 0


def test_one_step_at_a_time_an_empty_proposal_costs_nothing_and_is_no_miss():
    sched, speculator, (a, b) = setup({"a": [7, 8]})
    sched.update(sched.schedule(), {"a": 50, "b": 60})
    for token in (61, 62):
        speculator.propose(sched, allow_all)
        assert sched.deferred == set() and b.spec_token_ids == []
        step = sched.schedule()
        rows, _ = speculator.verify(step, [7, 8, 51, token], None)  # a's draft accepted
        sched.update(step, rows)
    assert speculator.proposer.calls == ["a", "b", "a", "b"]  # b asked at every step
    assert b.output_token_ids == [60, 61, 62]
