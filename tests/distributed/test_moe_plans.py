"""Mixtures of experts under every plan give the single-device tokens: gloo groups on the
CPU, tiny Qwen3-MoE (8 experts, top-2, one dense layer) and Mixtral (4 experts, top-2)
checkpoints. Experts TP-sharded (--moe-parallel tp) or split whole over the attention
group's SP x TP ranks (ep), under static plans and Shift's switches; steps of one sequence
leave experts (under EP, whole ranks) without tokens."""
import json
import random

import pytest

from parashift import LLM
from parashift.engine.policy import ScriptedPolicy
from tests.distributed.test_plans import (COMMON, PARAMS, assert_same, generate, plan_id,
                                          prompts, skip_unless_enough_gpus)
from tests.helpers.tiny_configs import save_tiny_checkpoint, tiny_config

TP2, SP2, TP4 = (dict(tensor_parallel_size=2), dict(sequence_parallel_size=2),
                 dict(tensor_parallel_size=4))
SP2_TP2 = dict(sequence_parallel_size=2, tensor_parallel_size=2)
CASES = [  # (family, plan)
    ("qwen3-moe", {**TP2, "moe_parallel": "tp"}), ("qwen3-moe", {**SP2, "moe_parallel": "tp"}),
    ("qwen3-moe", {**SP2_TP2, "moe_parallel": "tp"}),
    ("qwen3-moe", dict(data_parallel_size=2, moe_parallel="ep")),
    ("qwen3-moe", dict(pipeline_parallel_size=2, tensor_parallel_size=2, moe_parallel="ep")),
    ("qwen3-moe", {**TP2, "moe_parallel": "ep"}), ("qwen3-moe", {**SP2, "moe_parallel": "ep"}),
    ("qwen3-moe", {**SP2_TP2, "moe_parallel": "ep"}),
    # Mixtral's plans: test_mixtral_plans_match_single_device_and_leave_experts_idle
]
ONE_SEQUENCE = [[5, 9, 11]]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """family -> (checkpoint directory, its single-device outputs of prompts())."""
    out = {}
    for family in ("mixtral", "qwen3-moe"):
        directory = tmp_path_factory.mktemp(family)
        save_tiny_checkpoint(family, directory)
        out[family] = (str(directory), generate(directory, prompts())[0])
    return out


@pytest.mark.parametrize("family, plan", CASES, ids=[f"{f}-{plan_id(p)}" for f, p in CASES])
def test_plan_matches_single_device(models, family, plan):
    directory, reference = models[family]
    assert_same(generate(directory, prompts(), **plan)[0], reference)


@pytest.fixture(scope="module")
def one_sequence_reference(models):
    return generate(models["mixtral"][0], ONE_SEQUENCE)[0]


@pytest.mark.parametrize("plan, placement", [
    ({**TP4, "moe_parallel": "ep"}, [(rank, 1, 32) for rank in range(4)]),  # an expert a rank
    (dict(sequence_parallel_size=4, moe_parallel="ep"), None),
    ({**TP2, "moe_parallel": "tp"}, [(0, 4, 16)] * 2)], ids=["ep-tp4", "ep-sp4", "tp-tp2"])
def test_mixtral_plans_match_single_device_and_leave_experts_idle(models, one_sequence_reference,
                                                                  plan, placement):
    """One engine a plan: decode steps of one sequence's token route to 2 of Mixtral's 4
    experts, so under EP over 4 ranks two ranks' experts get nothing (and under SP=4 three
    ranks hold only padding); then prompts() give the single-device tokens, and where
    `placement` is given each rank holds those experts (as test_each_rank_holds_its_experts
    checks of the other plans)."""
    directory, reference = models["mixtral"]
    skip_unless_enough_gpus(plan)
    llm = LLM(directory, **{**COMMON, **plan})
    try:
        assert_same(llm.generate(ONE_SEQUENCE, PARAMS), one_sequence_reference)
        assert_same(llm.generate(prompts(), PARAMS), reference)
        layers = llm.llm_engine.executor.collective_rpc("expert_placement")
    finally:
        llm.llm_engine.shutdown()
    assert placement is None or layers == [[rank] * 2 for rank in placement]


@pytest.mark.parametrize("plan, placement", [
    ({**SP2_TP2, "moe_parallel": "ep"}, [(0, 1, 32), (2, 1, 32), (1, 1, 32), (3, 1, 32)]),
    ({**SP2, "moe_parallel": "tp"}, [(0, 4, 32)] * 2)],
    ids=["ep-sp2xtp2", "tp-sp2"])
def test_each_rank_holds_its_experts(models, plan, placement):
    """Mixtral's 4 experts of width 32 (both layers alike): EP gives rank r of the SP x TP
    group (TP-major, Shift's order) expert r whole; TP gives every rank 1/t of each (ep-tp4
    and tp-tp2: in the test above, on the engines that run those plans' tokens)."""
    directory, _ = models["mixtral"]
    skip_unless_enough_gpus(plan)
    llm = LLM(directory, **{**COMMON, **plan})
    try:
        layers = llm.llm_engine.executor.collective_rpc("expert_placement")
    finally:
        llm.llm_engine.shutdown()
    assert layers == [[rank] * 2 for rank in placement]


@pytest.mark.parametrize("mode, plan", [("tp", SP2), ("ep", SP2), ("ep", SP2_TP2),
                                        ("tp", SP2_TP2)],
                         ids=["tp-sp2", "ep-sp2", "ep-sp2xtp2", "tp-sp2xtp2"])
def test_shift_switches_match_single_device(models, mode, plan):
    """Random schedules of the base (SP, TP) plan and the shift plan (TP over SP x TP):
    TP-sharded experts take their narrowed slice, EP experts keep one layout."""
    directory, reference = models["qwen3-moe"]
    options = {**COMMON, **plan, "parallel_policy": "shift", "moe_parallel": mode}
    skip_unless_enough_gpus(options)
    llm = LLM(directory, **options)
    try:
        plans = llm.llm_engine.policy_plans
        rng = random.Random(0)
        llm.llm_engine.set_policy(ScriptedPolicy(plans, lambda group: rng.choice(plans)))
        assert_same(llm.generate(prompts(), PARAMS), reference)
    finally:
        llm.llm_engine.shutdown()


@pytest.mark.parametrize("mode", ["tp", "ep"])
def test_merges_and_splits_match_single_device(models, tmp_path, mode):
    """Flying Serving over two replicas that each hold every expert: they merge into TP=2
    and split again mid-generation. TP-sharded experts take their half of each expert's
    width; under EP the merged group computes each expert once, on the rank whose half of
    the experts holds it. No weight moves (the checksums are asserted by run_cycle)."""
    from tests.distributed.test_merges import run_cycle
    directory, _ = models["qwen3-moe"]
    reference = generate(directory, prompts(n=8))[0]
    outputs, records, *_ = run_cycle(directory, tmp_path, "single,single",
                                     ["merge2-tp2", "single,single"], limit=4,
                                     moe_parallel=mode)
    assert_same(outputs, reference)
    assert [r.kind for r in records][:2] == ["merge", "split"][:len(records)] and records


def test_experts_that_do_not_split_are_refused(tmp_path):
    """Six experts over four EP ranks: refused at start-up, naming the valid degrees."""
    shape = tmp_path / "mixtral-6-experts.json"
    cfg = tiny_config("mixtral").to_dict()
    shape.write_text(json.dumps({**cfg, "num_local_experts": 6,
                                 "architectures": ["MixtralForCausalLM"]}))
    with pytest.raises(ValueError, match=r"6 experts cannot be split over the sp\*tp = 4 ranks "
                                         r"of expert parallelism; valid sp\*tp degrees: "
                                         r"\[1, 2, 3, 6\]"):
        LLM(str(shape), **{**COMMON, **TP4, "moe_parallel": "ep"})
