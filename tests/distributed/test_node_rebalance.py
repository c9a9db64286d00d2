"""A group back in service takes its share of the waiting requests (engine/node_rebalance.py):
CPU ranks over gloo, a tiny random Llama, -dp 2 with 4 sequences a group at most, so that
most of 30 requests wait. Rank 1 is SIGKILLed after a few steps; its requests are queued on
rank 0 behind those waiting there. Once rank 1 serves again (the node re-forms its world at
a step boundary with nothing in flight), it takes the head of rank 0's queue until the two
hold as many requests (within one); every request ends once with one device's tokens."""
import os
import signal
import time
from collections import Counter

import pytest

from parashift import LLM
from parashift.engine import node_reform
from tests.distributed.test_fault_isolation import (  # noqa: F401 (fixtures)
    add_all, reference, requests)
from tests.distributed.test_self_healing import HEALING, RECOVERY_S, wait_recovered

MAX_NUM_SEQS = 4
STEPS_BEFORE_KILL = 3


@pytest.fixture(scope="module")
def dp2(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, data_parallel_size=2, max_num_seqs=MAX_NUM_SEQS, **HEALING)
    yield llm.llm_engine
    llm.shutdown()


def spy_on_moves(node, monkeypatch) -> list[dict]:
    """Each rebalancing that moved requests: every serving replica's (running, waiting)
    just before and just after it (the returned group's replica is the last)."""
    moves, tick = [], node.rebalancing.tick

    def counts():
        return [(r.scheduler.num_running, r.scheduler.num_waiting)
                for r in node.serving_replicas()]

    def ticking():
        before, moved = counts(), node.rebalancing.moved
        tick()
        if node.rebalancing.moved != moved:
            moves.append({"before": before, "after": counts(),
                          "moved": node.rebalancing.moved - moved})
    monkeypatch.setattr(node.rebalancing, "tick", ticking)
    return moves


def run_counting_ends(engine, ends: Counter, finished: dict, limit: int = 100_000) -> None:
    for _ in range(limit):
        if not engine.has_unfinished_requests():
            return
        for output in engine.step():
            if output.finished:
                ends[output.request_id] += 1
                finished[output.request_id] = output
    raise AssertionError("requests still running")


@pytest.mark.parametrize("rank, reforms", [(1, True), (0, True), (1, False)],
                         ids=["rank1", "rank0", "rank1-no-reforming"])
def test_the_returned_group_takes_its_share_of_the_queue(dp2, requests, reference,  # noqa: F811
                                                         rank, reforms, monkeypatch):
    """Rank 1, then rank 0 (the engine's first group), killed after a few steps, where a
    plan of the policy needs one world again (as Flying's merges do: forced here, so that
    the static policy's queues stay exact) and the requests move at the re-forming's quiet
    point; then rank 1 under the static policy as it is: its plans keep to one group each,
    so the node does not re-form (nor over several hosts or as Ray actors): scheduling
    stops until no step is in flight, then the requests move."""
    engine = dp2
    reforms_before = engine.node.reforming.reforms
    if reforms:
        monkeypatch.setattr(node_reform, "needs_one_world", lambda node: True)
    moves = spy_on_moves(engine.node, monkeypatch)
    rebalanced = engine.faults.requests_rebalanced  # (by the module's earlier tests)
    ids = add_all(engine, requests, prefix=f"share{rank}-")
    ends, finished = Counter(), {}
    for _ in range(STEPS_BEFORE_KILL):
        for output in engine.step():
            assert not output.finished
    os.kill(engine.executor.procs[rank].pid, signal.SIGKILL)
    started = time.monotonic()
    while not engine.faults.groups_down:  # health checks only: rank 0's queue waits
        assert time.monotonic() - started < RECOVERY_S, "the kill was not seen"
        engine.check_health()
        time.sleep(0.01)
    wait_recovered(engine, world=2)
    run_counting_ends(engine, ends, finished)
    (move,) = moves
    (running, waiting), back = move["before"][0], move["before"][1]
    assert back == (0, 0) and running <= MAX_NUM_SEQS and waiting > running
    expected = min(waiting, (running + waiting) // 2)  # loads within one, waiting ones only
    assert move["moved"] == expected
    assert move["after"] == [(running, waiting - expected), (0, expected)]
    assert engine.faults.requests_rebalanced == rebalanced + expected
    assert len(engine.node.worlds) == (1 if reforms else 2)
    assert engine.node.reforming.reforms == reforms_before + reforms
    assert sorted(ends) == sorted(ids) and set(ends.values()) == {1}  # each ended once
    for request_id, want in zip(ids, reference):
        output = finished[request_id]
        assert output.error is None, output.error
        assert output.outputs[0].token_ids == want, request_id
