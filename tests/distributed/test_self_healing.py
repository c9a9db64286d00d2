"""A lost group comes back (issue 64): CPU ranks over gloo, a tiny random Llama. A worker
SIGKILLed mid-decode costs its group while the others finish its requests; new processes
for the group's ranks meet at a new rendezvous, load the weights, and the group serves
again, with one device's tokens; rank 0 is no different (the engine hosts the store).
A rank lost during a merge aborts the merge; a group whose workers die at every start is
given up after max_worker_restarts."""
import os
import signal
import time

import pytest

from parashift import LLM
from tests.distributed.test_fault_isolation import (
    COMMON, add_all, assert_as_on_one_device, reference, requests, run_to_the_end,  # noqa: F401
    step_until_decoding)

HEALING = {**COMMON, "max_worker_restarts": 3}
RECOVERY_S = 60


@pytest.fixture(scope="module")
def dp2(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, data_parallel_size=2, **HEALING)
    yield llm.llm_engine
    llm.shutdown()


def wait_recovered(engine, world: int, timeout: float = RECOVERY_S) -> float:
    """Seconds until every rank serves again (the engine's idle health checks)."""
    started = time.monotonic()
    while engine.faults.ranks_alive < world or engine.faults.groups_down:
        assert time.monotonic() - started < timeout, engine.faults
        engine.check_health()
        time.sleep(0.05)
    return time.monotonic() - started


def kill_mid_decode_and_recover(engine, requests, reference, rank: int, world: int,  # noqa: F811
                                groups: int) -> None:
    ids = add_all(engine, requests, prefix=f"kill{rank}-")
    finished: dict = {}
    step_until_decoding(engine, finished)
    restarts = engine.faults.worker_restarts
    os.kill(engine.executor.procs[rank].pid, signal.SIGKILL)
    run_to_the_end(engine, finished)
    assert_as_on_one_device(finished, ids, reference)
    wait_recovered(engine, world)
    faults = engine.faults
    assert (faults.ranks_alive, faults.groups_serving) == (world, groups)
    assert faults.worker_restarts == restarts + 1 and 0 < faults.recovery_seconds < RECOVERY_S
    assert len(engine.layout.plans) == groups and not engine.layout.lost
    assert_serves_on_every_group(engine, requests, reference)


def assert_serves_on_every_group(engine, requests, reference) -> None:  # noqa: F811
    """Requests after the recovery run on every group (the restored one too) and end as
    on one device."""
    ids = add_all(engine, requests[:8], prefix=f"after{time.monotonic_ns()}-")
    assert {engine.node.replica_of[i].group for i in ids} == set(range(len(engine.layout.plans)))
    finished: dict = {}
    run_to_the_end(engine, finished)
    assert_as_on_one_device(finished, ids, reference[:8])


@pytest.mark.parametrize("rank", [1, 0], ids=["rank1", "rank0"])
def test_a_killed_replica_comes_back(dp2, requests, reference, rank):  # noqa: F811
    """-dp 2: rank 1, then rank 0 (which hosted the rendezvous before), killed mid-decode."""
    kill_mid_decode_and_recover(dp2, requests, reference, rank, world=2, groups=2)
    assert dp2.executor.procs[rank].is_alive()


@pytest.mark.parametrize("degrees, rank, plans", [
    ({"tensor_parallel_size": 2}, 1, ["tp2", "tp2@2-3"]),
    ({"pipeline_parallel_size": 2}, 3, ["pp2", "pp2@2-3"])], ids=["tp2-rank1", "pp2-rank3"])
def test_a_killed_rank_brings_its_group_back(tiny_llama_dir, requests, reference,  # noqa: F811
                                             degrees, rank, plans):
    """-dp 2 -tp 2: rank 1 killed takes out ranks 0-1; both come back as one TP group.
    -dp 2 -pp 2: rank 3 killed; ranks 2-3 come back, their stages handing over in a world
    of their own (torch ranks 0-1)."""
    llm = LLM(tiny_llama_dir, data_parallel_size=2, **degrees, **HEALING)
    try:
        kill_mid_decode_and_recover(llm.llm_engine, requests, reference, rank, world=4,
                                    groups=2)
        assert [p.name() for p in llm.llm_engine.layout.plans] == plans
    finally:
        llm.shutdown()


def test_a_rank_lost_during_a_merge_aborts_it(tiny_llama_dir, requests, reference):  # noqa: F811
    """Flying policy, -dp 3 merging replicas 0-1: rank 1 killed while the merge is prepared.
    The merge is aborted and its groups are taken out (not the engine); every request ends
    as on one device; ranks 0-1 come back."""
    llm = LLM(tiny_llama_dir, data_parallel_size=3, parallel_policy="flying",
              flying_dwell_s=0.0, flying_merge_running=0, **HEALING)
    engine = llm.llm_engine
    transition = engine.executor.transition

    def kill_in_prepare(ranks, verb, names, epoch=0):
        if verb == "prepare" and 1 in ranks and not killed:
            killed.append(1)
            os.kill(engine.executor.procs[1].pid, signal.SIGKILL)
        return transition(ranks, verb, names, epoch)
    killed: list = []
    engine.executor.transition = kill_in_prepare
    try:
        ids = add_all(engine, requests)
        finished: dict = {}
        llm.set_layout(2)
        run_to_the_end(engine, finished)
        assert killed and engine.executor.failure is None
        assert_as_on_one_device(finished, ids, reference)
        engine.executor.transition = transition
        wait_recovered(engine, world=3)
        assert engine.faults.worker_restarts == 1
        assert engine.layout.name() == "single,single@1,single@2"
        # the replaced ranks made their merged plan's communicators: the merge runs now
        ids = add_all(engine, requests, prefix="merged")
        finished = {}
        llm.set_layout(2)
        run_to_the_end(engine, finished)
        assert engine.layout.name() == "merge2-tp2,single@2"
        assert_as_on_one_device(finished, ids, reference)
    finally:
        llm.shutdown()


def test_a_worker_that_dies_at_every_start_is_given_up(tiny_llama_dir):
    """max_worker_restarts 2: rank 1 killed comes back (attempt 1); killed again, every
    replacement is killed as it starts: after attempt 2 (the count holds across losses),
    rank 1 stays out, named with why; rank 0 serves on."""
    llm = LLM(tiny_llama_dir, data_parallel_size=2, **{**COMMON, "max_worker_restarts": 2})
    engine = llm.llm_engine
    replacements = engine.executor.replacements
    start = replacements.start

    def start_and_kill(ranks, hosts=None):
        start(ranks, hosts)
        for proc, _ in replacements.attempts[-1].workers.values():
            os.kill(proc.pid, signal.SIGKILL)
    try:
        os.kill(engine.executor.procs[1].pid, signal.SIGKILL)
        wait_recovered(engine, world=2)
        replacements.start = start_and_kill
        os.kill(engine.executor.procs[1].pid, signal.SIGKILL)
        started = time.monotonic()
        while not engine.faults.given_up:
            assert time.monotonic() - started < 30
            engine.check_health()
            time.sleep(0.05)
        (given_up,) = engine.faults.given_up
        assert given_up.ranks == (1,) and "given up" in given_up.reason
        assert "died during start-up (killed by SIGKILL)" in given_up.reason
        assert engine.faults.worker_restarts == 2 and engine.faults.groups_serving == 1
        assert [g.ranks for g in engine.faults.groups_down] == [(1,)]
        time.sleep(1.5)
        engine.check_health()
        assert engine.faults.worker_restarts == 2  # no more attempts
        assert [p.ranks for p in engine.layout.plans] == [(0,)]
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def flying_dp2(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, data_parallel_size=2, parallel_policy="flying",
              flying_dwell_s=0.0, flying_merge_running=0, **HEALING)
    yield llm
    llm.shutdown()


def heal_and_merge(llm, requests, reference, reforms: int, world: int = 2,  # noqa: F811
                   merged: str = "merge2-tp2", split: str = "single,single@1") -> None:
    """Waits for every rank to serve in one re-formed world, then forces the merge of the
    two groups (over replaced ranks and surviving ones): one device's tokens."""
    engine, started = llm.llm_engine, time.monotonic()
    while not engine.faults.groups_down and engine.node.reforming.reforms < reforms:
        assert time.monotonic() - started < RECOVERY_S, "the kill was not seen"
        engine.check_health()
    wait_recovered(engine, world=world)
    while engine.node.reforming.reforms < reforms:
        assert time.monotonic() - started < RECOVERY_S, engine.node.worlds
        engine.check_health()
        time.sleep(0.05)
    assert engine.node.worlds == [frozenset(range(world))]
    ids = add_all(engine, requests, prefix=f"merged{reforms}-")
    finished: dict = {}
    llm.set_layout(2)
    run_to_the_end(engine, finished)
    assert engine.layout.name() == merged
    assert_as_on_one_device(finished, ids, reference)
    llm.set_layout(1)  # split again for the next loss
    started = time.monotonic()
    while engine.layout.name() != split:
        assert time.monotonic() - started < RECOVERY_S, engine.layout.name()
        engine.idle_turn() or engine.check_health()


def test_a_restored_group_merges_with_another(flying_dp2, requests, reference):  # noqa: F811
    """-dp 2 (flying): rank 1 killed comes back in a world of its own; the node then
    re-forms one world over ranks 0-1, so the merge of the restored group with the
    surviving one (tp2 over ranks 0 and 1) runs, with one device's tokens."""
    engine = flying_dp2.llm_engine
    flying_dp2.set_layout(1)
    os.kill(engine.executor.procs[1].pid, signal.SIGKILL)
    heal_and_merge(flying_dp2, requests, reference, reforms=1)
    assert engine.faults.worker_restarts == 1 and engine.executor.failure is None


def test_a_rank_lost_while_the_world_reforms(flying_dp2, requests, reference):  # noqa: F811
    """Rank 1 killed again, and once more as the node starts to re-form: the re-forming is
    called off (rank 0 keeps its world and serves), rank 1 is replaced again, the node
    re-forms, and the merge over ranks 0-1 runs with one device's tokens."""
    engine = flying_dp2.llm_engine
    executor = engine.executor
    reform, killed = executor.reform, []

    def kill_then_reform(members):
        if not killed:
            killed.append(executor.procs[1].pid)
            os.kill(executor.procs[1].pid, signal.SIGKILL)
        return reform(members)
    executor.reform = kill_then_reform
    try:
        restarts, rank0 = engine.faults.worker_restarts, executor.procs[0].pid
        os.kill(executor.procs[1].pid, signal.SIGKILL)
        started = time.monotonic()
        while engine.faults.worker_restarts < restarts + 2:  # the reform lost it again
            assert time.monotonic() - started < RECOVERY_S, engine.faults
            engine.check_health()
            time.sleep(0.05)
        assert killed and engine.executor.failure is None
        heal_and_merge(flying_dp2, requests, reference, reforms=2)
        assert executor.procs[0].pid == rank0  # rank 0 kept its world: never replaced
    finally:
        executor.reform = reform


def test_a_restored_tp_group_merges_across_worlds(tiny_llama_dir, requests,  # noqa: F811
                                                  reference):
    """-dp 2 -tp 2 (flying): rank 1 killed takes out ranks 0-1, which come back as one TP
    group in a world of their own; after the re-forming the merge to tp4 over all four
    ranks runs, with one device's tokens."""
    llm = LLM(tiny_llama_dir, data_parallel_size=2, tensor_parallel_size=2,
              parallel_policy="flying", flying_dwell_s=0.0, flying_merge_running=0, **HEALING)
    try:
        llm.set_layout(1)
        os.kill(llm.llm_engine.executor.procs[1].pid, signal.SIGKILL)
        heal_and_merge(llm, requests, reference, reforms=1, world=4, merged="merge2-tp4",
                       split="tp2,tp2@2-3")
    finally:
        llm.shutdown()
