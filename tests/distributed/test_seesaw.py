"""Seesaw end to end on gloo ranks: each group prefills under its prefill plan (PP) and
decodes under its decode plan (TP), its requests' KV moved through the CPU KV tier at
every transition; the greedy tokens equal one device's whatever the number of
transitions, and the tier's accounting returns to zero (aborts in every state too)."""
import random

import pytest

from parashift import LLM, SamplingParams
from parashift.step.message import PLACEHOLDER_TOKEN
from tests.distributed.test_plans import DEVICE, GRAPHS, assert_same, skip_unless_enough_gpus
from tests.engine.conftest import save_tiny_llama

PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=3)
COMMON = dict(device=DEVICE, dtype="float32", skip_tokenizer_init=True, num_blocks=64,
              max_num_batched_tokens=48, max_model_len=128)
MODELS = {"gqa8x4": (8, 4, 4), "gqa6x3": (6, 3, 3)}  # heads, KV heads, layers
PAIRS = [("gqa8x4", "pp2", "tp2"), ("gqa6x3", "pp3", "tp3"), ("gqa8x4", "pp2xtp2", "tp4"),
         ("gqa8x4", "pp4", "pp2xtp2")]
SMALL_TIER, LARGE_TIER = 56, 4096  # tokens: a prompt or two per phase, or every request at once


def prompts(seed=0, n=7, vocab=512):
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(1, 40))] for _ in range(n)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    dirs = {name: save_tiny_llama(tmp_path_factory.mktemp(name), num_attention_heads=heads,
                                  num_key_value_heads=kv, hidden_size=96, intermediate_size=192,
                                  num_hidden_layers=layers)
            for name, (heads, kv, layers) in MODELS.items()}
    refs = {}
    for name, d in dirs.items():
        llm = LLM(d, **COMMON)
        refs[name] = llm.generate(prompts(), PARAMS)
        llm.llm_engine.shutdown()
    return dirs, refs


def seesaw_llm(model_dir, prefill, decode, tokens, **options):
    plan = dict(parallel_policy="seesaw", prefill_plan=prefill, decode_plan=decode,
                cpu_kv_tokens=tokens)
    skip_unless_enough_gpus(plan)
    # GPU machine: the decode plan's graphs, where it has one stage (a pipeline runs eagerly)
    graphs = {"cuda_graphs": "pp" not in decode} if GRAPHS else {}
    return LLM(model_dir, **{**COMMON, **plan, **graphs, **options})


def directions(records):
    return [(r.kind, r.target) for r in records]


@pytest.mark.parametrize("name, prefill, decode", PAIRS,
                         ids=[f"{p}-{d}" for _, p, d in PAIRS])
def test_tokens_equal_one_device_over_many_transitions_and_one(models, name, prefill, decode):
    dirs, refs = models
    for tier_tokens, least, most, source in ((SMALL_TIER, 5, None, "peers"),
                                             (LARGE_TIER, 1, 1, "host")):
        llm = seesaw_llm(dirs[name], prefill, decode, tier_tokens, seesaw_weight_source=source)
        engine = llm.llm_engine
        try:
            overlapped = spy_on_overlaps(engine)
            assert_same(llm.generate(prompts(), PARAMS), refs[name])
            # a one-stage decode plan keeps two steps in flight (async scheduling); the
            # prefill plan a step per stage, without placeholders, while prompts wait: in the
            # large tier's first step() the second step admits the prompts the first left
            stages = {engine.node.plans_by_name[plan].pp for plan in overlapped}
            assert (1 in stages) == ("pp" not in decode)
            if tier_tokens == LARGE_TIER:
                assert int(prefill.split("xtp")[0].removeprefix("pp")) in stages
                # two stages: the phase takes more steps than stages, and the prompts that
                # earlier steps finished go to the tier with later ones, before the transition
                if prefill.startswith("pp2"):
                    assert next(iter(engine.seesaw.values())).stashed_tokens > 0
            records = engine.take_transition_records()
            assert len(records) >= least and (most is None or len(records) <= most)
            assert all(r.kind == "reshard" for r in records)
            # phases alternate from the prefill plan; every one re-shards the weights (the
            # least arena), and each move to decode carries the prefilled KV through the tier
            assert [r.direction for r in records] == ["to_decode", "to_prefill"] * (
                len(records) // 2) + ["to_decode"] * (len(records) % 2)
            assert all(r.weight_bytes > 0 and r.stall_s > 0 for r in records)
            # from peers: a rank lacks what another's old plan holds, and both plans hold the
            # whole model, so the host copies serve nothing; from host: everything
            if source == "peers":
                assert all(r.weight_peer_bytes > 0 and r.weight_host_bytes == 0 for r in records)
            else:
                assert all(r.weight_peer_bytes == 0 and r.weight_host_bytes == r.weight_bytes
                           for r in records)
            assert all(r.kv_bytes_out == r.kv_bytes_in > 0 for r in records
                       if r.direction == "to_decode")
            phases = engine.take_phase_seconds()
            assert phases["prefill"] > 0 and phases["decode"] > 0 and phases["transition"] > 0
            tier = next(iter(engine.seesaw.values()))
            assert tier.slots.used_tokens == 0 and tier.slots.largest_free() == tier_tokens
        finally:
            engine.shutdown()


def spy_on_overlaps(engine) -> set[str]:
    """The plans of the steps submitted while the replica had another in flight, checking
    that a pipelined plan's step then carries no placeholder (its first stage could not
    fill it)."""
    overlapped, submit = set(), engine.executor.submit

    def spying_submit(replica, ranks, output_rank, batch):
        if replica.in_flight:
            overlapped.add(batch.plan)
            if engine.node.plans_by_name[batch.plan].pp > 1:
                assert all(PLACEHOLDER_TOKEN not in chunk.token_ids for chunk in batch.all_chunks())
        submit(replica, ranks, output_rank, batch)
    engine.executor.submit = spying_submit
    return overlapped


def _step_until(engine, done, limit=200):
    for _ in range(limit):
        if done():
            return
        engine.step()
    raise AssertionError("the engine never reached the state")


@pytest.fixture(scope="module")
def small_steps(models):
    """pp2 -> tp2 over the small tier, with a small step budget: the prompts take several
    steps (two in flight) in the prefill plan."""
    dirs, _ = models
    llm = seesaw_llm(dirs["gqa8x4"], "pp2", "tp2", SMALL_TIER, max_num_batched_tokens=16)
    yield llm.llm_engine
    llm.llm_engine.shutdown()


def test_aborts_in_every_state_free_their_slots(small_steps):
    engine = small_steps
    tier = next(iter(engine.seesaw.values()))
    for i, prompt in enumerate(prompts(seed=3, n=6)):
        engine.add_request(f"r{i}", prompt, PARAMS)
    waiting = [s.request_id for s in engine.replicas[0].scheduler.waiting]
    engine.abort_request(waiting[-1])  # waiting, no slot yet
    _step_until(engine, lambda: tier.slots.requests_in("writing"))
    writing = tier.slots.requests_in("writing")[0]
    engine.abort_request(writing)  # its prompt computed (or being computed) in the prefill plan
    assert writing not in tier.slots.slots
    _step_until(engine, lambda: tier.slots.requests_in("loading"))
    loading = tier.slots.requests_in("loading")[0]
    engine.abort_request(loading)  # decoding in the decode plan
    assert loading not in tier.slots.slots
    _step_until(engine, lambda: not engine.has_unfinished_requests())
    assert tier.slots.used_tokens == 0 and tier.slots.largest_free() == SMALL_TIER
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_resident_weights_switch_with_no_weight_copies(models):
    """--seesaw-resident-weights: both plans' shards stay on each rank; the tokens are one
    device's and no transition copies a weight byte (the KV still moves)."""
    dirs, refs = models
    llm = seesaw_llm(dirs["gqa8x4"], "pp2", "tp2", SMALL_TIER, seesaw_resident_weights=True)
    engine = llm.llm_engine
    try:
        assert_same(llm.generate(prompts(), PARAMS), refs["gqa8x4"])
        records = engine.take_transition_records()
        assert len(records) >= 5 and all(r.weight_bytes == 0 for r in records)
        assert any(r.kv_bytes_in > 0 for r in records)
    finally:
        engine.shutdown()


def test_requests_the_tier_cannot_hold_and_bad_options_are_refused(models, small_steps):
    dirs, _ = models
    one_over = [1] * (SMALL_TIER - PARAMS.max_tokens + 1)  # prompt + max_tokens: the tier + 1
    with pytest.raises(ValueError, match=rf"more than the CPU KV tier holds \({SMALL_TIER}\)"):
        small_steps.add_request("big", one_over, PARAMS)
    assert not small_steps.has_unfinished_requests()
    from parashift.config import EngineConfig
    seesaw = dict(parallel_policy="seesaw", prefill_plan="pp2", decode_plan="tp2")
    with pytest.raises(ValueError, match="one of cpu_kv_tokens or cpu_kv_gib"):
        EngineConfig(**seesaw)
    with pytest.raises(ValueError, match="cpu_kv_tokens is an option of the seesaw policy"):
        EngineConfig(cpu_kv_tokens=10)
    with pytest.raises(ValueError, match="seesaw_resident_weights is an option of the seesaw"):
        EngineConfig(seesaw_resident_weights=True)
    with pytest.raises(ValueError, match="seesaw_resident_weights must be true or false"):
        EngineConfig(**seesaw, cpu_kv_tokens=10, seesaw_resident_weights="yes")
    with pytest.raises(ValueError, match="seesaw_weight_source must be one of"):
        EngineConfig(**seesaw, cpu_kv_tokens=10, seesaw_weight_source="nvlink")
    with pytest.raises(ValueError, match="seesaw_weight_source is an option of the seesaw"):
        EngineConfig(seesaw_weight_source="peers")
    with pytest.raises(ValueError, match="give one"):
        EngineConfig(**seesaw, cpu_kv_tokens=10, seesaw_weight_source="peers",
                     seesaw_resident_weights=True)
    with pytest.raises(ValueError, match="drop tensor_parallel_size"):
        EngineConfig(**seesaw, cpu_kv_tokens=10, tensor_parallel_size=2)
    with pytest.raises(ValueError, match="must each cover"):
        LLM(dirs["gqa8x4"], **{**COMMON, **seesaw, "decode_plan": "tp4", "cpu_kv_tokens": 10})


@pytest.mark.parametrize("rates", ["probed", "nvlink", "pcie"])
def test_auto_resolves_at_start_up_and_keeps_the_tokens(models, tmp_path, monkeypatch, rates):
    """prefill_plan='auto:2' over this machine's probed rates, NVLink-like ones (a static
    plan: the static policy runs it) or slow links and a memory that barely holds the
    weights (the paper's regime, scaled to the tiny model: PP prefill, TP decode); the
    engine starts and its tokens are one device's."""
    import json
    from dataclasses import asdict, replace

    from parashift.engine import hardware_probe
    from tests.engine.policy.test_seesaw_cost import A10_PCIE, H100_NVLINK
    if DEVICE == "cuda":
        pytest.skip("auto:2 on the CPU's probe; on GPUs the cache file is named by the GPU")
    dirs, refs = models
    # the cache's place by the function that reads PARASHIFT_CACHE_DIR (test_seesaw_auto.py
    # checks the variable): a PARASHIFT_ variable set here would spawn the ranks, each
    # importing torch, instead of forking them from the fork server (process_start.py)
    monkeypatch.setattr(hardware_probe, "cache_dir", lambda: tmp_path)
    tiny_pcie = replace(A10_PCIE, all_reduce_bus_bytes_per_s=1e8, hbm_bytes_per_s=1e8,
                        matmul_flops=1e11, memory_bytes=2e6)
    hardware = {"nvlink": H100_NVLINK, "pcie": tiny_pcie}.get(rates)
    if hardware is not None:
        (tmp_path / "probe-cpu.json").write_text(json.dumps(asdict(hardware)))
    llm = LLM(dirs["gqa8x4"], **COMMON, parallel_policy="seesaw", prefill_plan="auto:2",
              cpu_kv_tokens=LARGE_TIER, seesaw_mean_prompt_tokens=60, seesaw_mean_output_tokens=8)
    engine = llm.llm_engine
    try:
        assert engine.layout.world_size == 2 and not engine.config.auto_plans
        if rates == "nvlink":
            assert engine.config.parallel_policy == "static" and engine.policy.name == "static"
        if rates == "pcie":
            assert (engine.config.seesaw.prefill_plan,
                    engine.config.seesaw.decode_plan) == ("pp2", "tp2")
        assert_same(llm.generate(prompts(), PARAMS), refs["gqa8x4"])
        if rates == "pcie":
            assert engine.take_transition_records()
    finally:
        engine.shutdown()


def test_random_weights_switch_from_peers_and_pin_nothing(tmp_path):
    """Random weights (no checkpoint) take the peer path too: the running plan's draw
    stands for the checkpoint, so a switch reads nothing from the host copies."""
    shape = tmp_path / "tiny.json"
    shape.write_text('{"model_type": "llama", "architectures": ["LlamaForCausalLM"], '
                     '"vocab_size": 512, "hidden_size": 96, "intermediate_size": 192, '
                     '"num_hidden_layers": 4, "num_attention_heads": 8, '
                     '"num_key_value_heads": 4, "tie_word_embeddings": false}')
    llm = seesaw_llm(str(shape), "pp2", "tp2", SMALL_TIER, seesaw_weight_source="peers")
    engine = llm.llm_engine
    try:
        outputs = llm.generate(prompts(), PARAMS)
        assert all(len(o.outputs[0].token_ids) == PARAMS.max_tokens for o in outputs)
        records = engine.take_transition_records()
        assert len(records) >= 2
        assert all(r.weight_peer_bytes > 0 and r.weight_host_bytes == 0 for r in records)
    finally:
        engine.shutdown()
