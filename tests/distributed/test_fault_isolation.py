"""A dead rank takes out its group, not the node (issue 21): CPU ranks over gloo, a tiny
random Llama. The requests of the lost group are computed again on the groups left and
end as they would have on one device; only when no group is left do they fail."""
import contextlib
import os
import signal
import time

import pytest

from parashift import LLM, SamplingParams
from parashift.executor.multiproc import WorkerFailure
from tests.distributed.test_executor import assert_all_gone
from tests.distributed.test_plans import prompts

PARAMS = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
COMMON = dict(device="cpu", dtype="float32", skip_tokenizer_init=True, num_blocks=128,
              worker_timeout_s=300, max_worker_restarts=0)  # losses for good (no healing)


@pytest.fixture(scope="module")
def requests():
    return prompts(seed=21, n=30)


@pytest.fixture(scope="module")
def reference(tiny_llama_dir, requests):
    """Each request's tokens on one device."""
    llm = LLM(tiny_llama_dir, **COMMON)
    try:
        return [out.outputs[0].token_ids for out in llm.generate(requests, PARAMS)]
    finally:
        llm.shutdown()


@pytest.fixture
def dp3(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, data_parallel_size=3, **COMMON)
    yield llm.llm_engine
    llm.shutdown()


def add_all(engine, token_lists, prefix="r") -> list[str]:
    ids = [f"{prefix}{i}" for i in range(len(token_lists))]
    for request_id, tokens in zip(ids, token_lists):
        engine.add_request(request_id, tokens, PARAMS)
    return ids


def step_until_decoding(engine, finished: dict) -> None:
    """Steps until every request has generated a token. One replica may run ahead of the
    other on a loaded machine: a request that ends meanwhile goes to `finished`."""
    started = set()

    def live() -> int:  # started and not ended
        return len(started - finished.keys())

    while live() < engine.stats().num_running + engine.stats().num_waiting or not started:
        for output in engine.step():
            started.add(output.request_id)
            if output.finished:
                finished[output.request_id] = output
        if engine.stats().num_waiting == 0 and live() == engine.stats().num_running:
            return


def run_to_the_end(engine, finished: dict, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while engine.has_unfinished_requests():
        assert time.monotonic() < deadline, "requests still running"
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output


def wait_until_lost(engine, rank: int, timeout: float = 10) -> None:
    """Until the engine has lost `rank`: on a loaded machine its replica may have ended its
    requests before the stop or the death was seen, and the others theirs within the 1 s a
    stopped rank is given (it must be seen all the same, still stopped, and killed)."""
    deadline = time.monotonic() + timeout
    while rank not in engine.executor.lost:
        assert time.monotonic() < deadline, f"rank {rank} was not seen lost"
        engine.check_health()
        time.sleep(0.05)


def assert_as_on_one_device(finished: dict, ids: list[str], reference) -> None:
    for request_id, want in zip(ids, reference):
        output = finished[request_id]
        assert output.error is None, output.error
        assert output.outputs[0].token_ids == want, request_id


@contextlib.contextmanager
def stopped(pid: int):
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def lose_rank_mid_decode(engine, requests, reference, rank: int, stop: bool) -> dict:
    ids = add_all(engine, requests)
    finished: dict = {}
    step_until_decoding(engine, finished)
    procs = list(engine.executor.procs)
    with stopped(procs[rank].pid) if stop else contextlib.nullcontext():
        if not stop:
            os.kill(procs[rank].pid, signal.SIGKILL)
        run_to_the_end(engine, finished)
        wait_until_lost(engine, rank)
    assert_as_on_one_device(finished, ids, reference)
    procs[rank].join(timeout=10)
    assert not procs[rank].is_alive()  # killed for good, a stopped one too
    return finished


def test_a_killed_replica_costs_its_group_only(dp3, requests, reference):
    """-dp 3, 30 greedy requests in flight, rank 1 SIGKILLed mid-decode: all 30 end as on
    one device (rank 1's recomputed on ranks 0 and 2); a request after the kill runs; killing
    the other two fails what is outstanding, at once, naming the rank."""
    lose_rank_mid_decode(dp3, requests, reference, rank=1, stop=False)
    faults = dp3.faults
    assert (faults.ranks_alive, faults.groups_serving) == (2, 2)
    (down,) = faults.groups_down
    assert down.ranks == (1,) and "rank 1 died (killed by SIGKILL)" in down.reason
    assert 0 < faults.requests_requeued <= 10  # rank 1's third of the 30
    assert [plan.ranks for plan in dp3.layout.plans] == [(0,), (2,)]
    assert dp3.layout_info()["groups"] == [{"ranks": [0], "plan": "single", "width": 1},
                                           {"ranks": [2], "plan": "single@2", "width": 1}]

    after: dict = {}
    ids = add_all(dp3, requests[:4], prefix="after")
    run_to_the_end(dp3, after)
    assert_as_on_one_device(after, ids, reference[:4])

    add_all(dp3, requests[:6], prefix="last")
    dp3.step()
    procs = list(dp3.executor.procs)
    os.kill(procs[0].pid, signal.SIGKILL)
    os.kill(procs[2].pid, signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(WorkerFailure) as failure:
        while True:
            dp3.step()
    assert time.monotonic() - started < 2
    first = str(failure.value).splitlines()[0]
    assert "died (killed by SIGKILL)" in first and "no group of the node is left" in first
    assert_all_gone(procs)


def test_a_stopped_replica_costs_its_group_only(dp3, requests, reference):
    """The same with rank 2 stopped (SIGSTOP): dead after 1 s of silence, killed."""
    started = time.monotonic()
    lose_rank_mid_decode(dp3, requests, reference, rank=2, stop=True)
    assert time.monotonic() - started < 60
    (down,) = dp3.faults.groups_down
    assert down.ranks == (2,) and "no heartbeat" in down.reason and "process is stopped" in down.reason
    assert dp3.faults.groups_serving == 2


def test_a_stopped_idle_replica_is_seen_within_2_s(dp3):
    procs = list(dp3.executor.procs)
    with stopped(procs[0].pid):
        started = time.monotonic()
        while dp3.faults.groups_serving == 3:
            assert time.monotonic() - started < 2
            dp3.check_health()
            time.sleep(0.05)
    assert [plan.ranks for plan in dp3.layout.plans] == [(1,), (2,)]


def test_a_dead_tp_rank_takes_out_its_tp_group_only(tiny_llama_dir, requests, reference):
    """-dp 2 -tp 2 (4 ranks): rank 1 killed; its TP peer, rank 0, is lost with it (killed:
    a collective with a dead peer is never used again); ranks 2-3 serve every request."""
    llm = LLM(tiny_llama_dir, data_parallel_size=2, tensor_parallel_size=2, **COMMON)
    engine = llm.llm_engine
    try:
        procs = list(engine.executor.procs)
        lose_rank_mid_decode(engine, requests, reference, rank=1, stop=False)
        assert [plan.name() for plan in engine.layout.plans] == ["tp2@2-3"]
        assert engine.layout.lost == (0, 1)
        assert sorted(engine.executor.alive) == [2, 3]
        (down,) = engine.faults.groups_down
        assert down.ranks == (0, 1) and "rank 1 died" in down.reason
        procs[0].join(timeout=10)
        assert not procs[0].is_alive()
        assert procs[2].is_alive() and procs[3].is_alive()
    finally:
        llm.shutdown()


@pytest.mark.parametrize("rank, left", [(2, {0, 1}), (1, {2})])
def test_a_merged_node_loses_the_groups_of_its_dead_rank(tiny_llama_dir, requests, reference,
                                                         rank, left):
    """Flying policy, -dp 3 merged to width 2 (ranks 0-1 one TP group, rank 2 alone): rank 2
    dead leaves the merged group serving under the flying policy over replicas 0 and 1 (which
    splits it: requests run, and merge_running is 0); rank
    1 dead takes the merged group (and the replicas its merge left behind) with it, and rank 2
    serves alone under a static policy. Every request ends as on one device; no plan the
    policy may pick needs a lost rank."""
    llm = LLM(tiny_llama_dir, data_parallel_size=3, parallel_policy="flying",
              flying_dwell_s=0.0, flying_merge_running=0, **COMMON)
    engine = llm.llm_engine
    try:
        ids = add_all(engine, requests)
        finished: dict = {}
        llm.set_layout(2)
        while engine.layout.name() != "merge2-tp2,single@2":
            for output in engine.step():
                assert not output.finished
        engine.step()
        os.kill(engine.executor.procs[rank].pid, signal.SIGKILL)
        run_to_the_end(engine, finished)
        assert_as_on_one_device(finished, ids, reference)
        assert {r for plan in engine.layout.plans for r in plan.ranks} == left
        assert engine.policy.name == ("flying" if rank == 2 else "static")
        lost = set(engine.layout.lost)
        assert all(lost.isdisjoint(plan.ranks) for plan in engine.policy.plans)
        assert engine.layout_info()["forced_width"] is None
        assert all(lost.isdisjoint(r.ranks) for r in engine.replicas)
    finally:
        llm.shutdown()
