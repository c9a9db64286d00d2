"""SiDP (issue 17): data-parallel replicas that share FFN weights, each rank holding a 1/d
slice of every FFN layer, give the single-device tokens in both modes and across mode
switches; Weight-as-a-Service computes bit for bit what plain DP computes; the slots hold
the owners' bytes; an idle replica moves nothing in WaS and still serves in CaS. CPU ranks
over gloo; the one-sided reads of the slices are reads of the owners' shared memory."""
import os
import random
import signal
import time

import pytest

from parashift import LLM, SamplingParams
from parashift.engine.policy import SidpPolicy
from parashift.executor.multiproc import WorkerFailure
from tests.distributed.test_plans import (COMMON, PARAMS, assert_same, prompts,
                                          skip_unless_enough_gpus)
from tests.engine.conftest import save_tiny_llama
from tests.helpers.policies import FfnModeSchedule

LONG = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=4)
# both modes' plans made at start-up (the sidp policy's), the switches scripted by the test;
# on a GPU its CaS plans replay graphs by default, its WaS plans run eagerly
SWITCHABLE = dict(parallel_policy="sidp", sidp_batch_threshold=10**9)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("sidp"), num_attention_heads=8,
                           num_key_value_heads=4, hidden_size=96, intermediate_size=192,
                           num_hidden_layers=3)


def run(model_dir, prompt_list, params=PARAMS, policy=None, **options):
    skip_unless_enough_gpus(options)
    llm = LLM(model_dir, **{**COMMON, **options})
    engine = llm.llm_engine
    try:
        if policy is not None:
            engine.set_policy(policy(engine))
        outputs = llm.generate(prompt_list, params)
        stats = (engine.executor.collective_rpc("shared_ffn_stats")
                 if options.get("share_ffn") else None)
        return outputs, stats, engine.policy
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def reference(model):
    return run(model, prompts(n=8))[0]


@pytest.fixture(scope="module")
def long_reference(model):
    return run(model, prompts(n=8), LONG)[0]


@pytest.fixture(scope="module")
def two_sharing_replicas(model):
    """mode -> (outputs, stats) of prompts(n=8) on two replicas that share FFN weights
    (dp 2, tp 1) in that mode, each engine started once for the module's tests that run it."""
    runs = {}

    def outputs_and_stats(mode):
        if mode not in runs:
            runs[mode] = run(model, prompts(n=8), data_parallel_size=2, share_ffn=True,
                             sidp_mode=mode)[:2]
        return runs[mode]
    return outputs_and_stats


def test_was_is_bit_identical_to_plain_dp(model, two_sharing_replicas):
    """The same per-replica batches: WaS runs the very GEMMs plain DP runs (the slots hold
    the whole shard, rows in loading order); both eager (a graph pads its batch to a bucket,
    and a GEMM of other rows may sum in another order)."""
    plain = run(model, prompts(n=8), data_parallel_size=2, cuda_graphs=False)[0]
    shared, stats = two_sharing_replicas("was")
    for got, want in zip(shared, plain):
        assert got.outputs[0].token_ids == want.outputs[0].token_ids
        assert got.outputs[0].logprobs == want.outputs[0].logprobs  # exactly
    assert all(s["bytes_fetched"] > 0 for s in stats)


@pytest.mark.parametrize("dp, tp", [(2, 1), (4, 1), (2, 2)])
@pytest.mark.parametrize("mode", ["was", "cas"])
def test_tokens_equal_the_reference(model, reference, two_sharing_replicas, dp, tp, mode):
    if (dp, tp) == (2, 1):
        outputs, stats = two_sharing_replicas(mode)
    else:  # GPU: CaS's graphs by default
        outputs, stats, _ = run(model, prompts(n=8), data_parallel_size=dp,
                                tensor_parallel_size=tp, share_ffn=True, sidp_mode=mode)
    assert_same(outputs, reference)
    owned = {s["owned_bytes"] for s in stats}
    assert len(owned) == 1 and len(stats) == dp * tp
    if mode == "cas":
        assert all(s["bytes_fetched"] == 0 for s in stats)  # activations move, not weights
        # prompts' rounds take their counts from the engine (no exchange); decode rounds pad
        # to one known shape
        assert all(s["counted_rounds"] > 0 and s["padded_rounds"] > 0 for s in stats)
        assert all(s["exchanged_rounds"] == 0 for s in stats)


@pytest.mark.parametrize("mode", ["was", "cas"])
def test_the_start_up_profile_step_runs_on_shared_weights(model, reference, mode):
    """A GPU sizes its KV pool by a profiling step that every rank runs at start-up; under
    CaS it exchanges tokens with the peers like a step of its own round. Run again on CPU
    ranks, it passes on both modes and the engine still gives the reference's tokens."""
    llm = LLM(model, **{**COMMON, "data_parallel_size": 2, "share_ffn": True,
                        "sidp_mode": mode})
    try:
        assert llm.llm_engine.executor.collective_rpc("profile_step") == [None, None]
        assert_same(llm.generate(prompts(n=8), PARAMS), reference)
    finally:
        llm.llm_engine.shutdown()


def test_switches_every_7_steps(model, long_reference):
    """Forced WaS <-> CaS every 7 decisions, mid-generation: the tokens stay the reference's."""
    outputs, stats, policy = run(
        model, prompts(n=8), LONG, policy=lambda e: FfnModeSchedule(
            e, lambda i: ("was", "cas")[i // 7 % 2]),
        data_parallel_size=2, **SWITCHABLE)
    assert_same(outputs, long_reference)
    assert policy.calls > 30 and {"was", "cas"} <= set(policy.modes)


def test_an_idle_replica_moves_nothing_in_was_and_serves_in_cas(model, reference):
    """One request on two replicas: the idle one fetches no byte under WaS; under CaS it
    runs every round with no tokens, its slices serving the busy one."""
    one = prompts(n=8)[:1]
    for mode in ("was", "cas"):
        outputs, stats, _ = run(model, one, data_parallel_size=2, share_ffn=True,
                                sidp_mode=mode)
        assert_same(outputs, reference[:1])
        fetched = sorted(s["bytes_fetched"] for s in stats)
        assert fetched[0] == 0
        assert (fetched[1] > 0) == (mode == "was")


def test_every_slot_holds_its_owners_bytes(model):
    """TP = 2 inside each of two replicas: each rank's slots hold, piece by piece, the bytes
    of the slices its peers (the other replica's rank at its TP position) own."""
    options = dict(data_parallel_size=2, tensor_parallel_size=2, share_ffn=True, sidp_mode="was")
    skip_unless_enough_gpus(options)
    llm = LLM(model, **COMMON, **options)
    try:
        sums = llm.llm_engine.executor.collective_rpc("shared_ffn_checksums")
    finally:
        llm.llm_engine.shutdown()
    assert [s["peers"] for s in sums] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    for rank, mine in enumerate(sums):
        for layer, pieces in enumerate(mine["fetched"]):
            assert pieces == [sums[peer]["own"][layer] for peer in mine["peers"]]
    assert len({s["own"][0] for s in sums}) == 4  # four different slices


def test_100_random_switch_schedules(model):
    """100 requests' worth of random mode schedules on one engine (a switch at any
    decision, runs of any length): no hang, and every request's tokens are a prefix of the
    single-device ones."""
    pool = prompts(seed=3, n=6)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in run(model, pool, params)[0]]
    llm = LLM(model, **{**COMMON, "data_parallel_size": 2, **SWITCHABLE})
    engine = llm.llm_engine
    rng = random.Random(0)
    try:
        for _ in range(100):
            schedule = [rng.choice(("was", "cas")) for _ in range(rng.randint(1, 12))]
            engine.set_policy(FfnModeSchedule(engine, lambda i, s=schedule: s[i % len(s)]))
            picked = rng.sample(range(len(pool)), rng.randint(1, 3))
            tokens = rng.randint(1, 6)
            started = time.monotonic()
            outputs = llm.generate([pool[i] for i in picked],
                                   SamplingParams(temperature=0, max_tokens=tokens,
                                                  ignore_eos=True), use_tqdm=False)
            assert time.monotonic() - started < 30
            for i, out in zip(picked, outputs):
                assert out.outputs[0].token_ids == want[i][:tokens]
    finally:
        engine.shutdown()


def test_the_sidp_policy_switches_by_step_size(model, long_reference):
    """B_th = 10 tokens per busy replica: prefill steps (up to 40 tokens) go to WaS, decode
    steps (a token per request, at most 4 requests a replica) back to CaS."""
    outputs, _, policy = run(model, prompts(n=8), LONG, parallel_policy="sidp",
                             data_parallel_size=2, sidp_batch_threshold=10,
                             sidp_min_dwell_steps=2)
    assert isinstance(policy, SidpPolicy) and policy.switches >= 2
    assert_same(outputs, long_reference)


def test_a_dead_rank_fails_the_sharing_group_fast(model):
    """Rank 1 killed mid-decode: rank 0 shares its FFN weights, so it is taken out too; no
    group is left and the engine fails within seconds instead of hanging in a collective."""
    llm = LLM(model, **COMMON, data_parallel_size=2, share_ffn=True, worker_step_timeout_s=20)
    engine = llm.llm_engine
    try:
        for i, tokens in enumerate(prompts(n=4)):
            engine.add_request(f"r{i}", tokens, LONG)
        engine.step()
        os.kill(engine.executor.procs[1].pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(WorkerFailure, match="no group of the node is left"):
            while engine.has_unfinished_requests():
                engine.step()
        assert time.monotonic() - started < 10
    finally:
        llm.shutdown()
