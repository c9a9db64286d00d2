"""Deterministic mode for mixtures of experts (tiny Qwen3-MoE: 8 experts, top-2, one dense
layer; Mixtral: 4 experts): a request's tokens and logprobs are bit-identical alone and in
batches of 8 and 64, and on every plan (experts TP-sharded or split whole over EP ranks)
and under Shift's switches, to one device (gloo, one process per rank)."""
import json
import random

import pytest

from parashift import LLM
from parashift.engine.policy import ScriptedPolicy
from tests.deterministic.test_batch_invariance import assert_batch_invariant, assert_identical
from tests.deterministic.test_plan_invariance import COMMON, run
from tests.helpers.tiny_configs import save_tiny_checkpoint, tiny_config

TP2, SP2 = dict(tensor_parallel_size=2), dict(sequence_parallel_size=2)
PLANS = [{**TP2, "moe_parallel": "tp"}, {**TP2, "moe_parallel": "ep"},
         {**SP2, "moe_parallel": "ep"}, dict(data_parallel_size=2)]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    dirs = {family: tmp_path_factory.mktemp(family) for family in ("qwen3-moe", "mixtral")}
    for family, directory in dirs.items():
        save_tiny_checkpoint(family, directory)
    return {family: str(directory) for family, directory in dirs.items()}


@pytest.mark.parametrize("family, dtype", [("qwen3-moe", "float32"), ("qwen3-moe", "bfloat16"),
                                           ("mixtral", "bfloat16")])
def test_alone_in_8_and_in_64(model_dirs, family, dtype):
    assert_batch_invariant(LLM(model_dirs[family], dtype=dtype, **COMMON))


@pytest.fixture(scope="module")
def reference(model_dirs):
    return run(model_dirs["qwen3-moe"], "float32")


def plan_id(plan: dict) -> str:
    return "-".join(f"{k[0]}p{v}" if isinstance(v, int) else v for k, v in plan.items())


@pytest.mark.parametrize("plan", PLANS, ids=plan_id)
def test_plan_gives_single_device_logprobs(model_dirs, reference, plan):
    assert_identical(run(model_dirs["qwen3-moe"], "float32", **plan), reference)


@pytest.mark.parametrize("mode", ["tp", "ep"])
def test_shift_switches_give_single_device_logprobs(model_dirs, reference, mode):
    """Shift over 2 ranks, each step on SP=2 or on TP=2 over SP_TP at random: TP-sharded
    experts take their narrowed slices, EP experts keep theirs."""
    rng = random.Random(0)

    def random_switches(plans):
        return ScriptedPolicy(plans, lambda group: rng.choice(plans))
    outputs = run(model_dirs["qwen3-moe"], "float32", random_switches, parallel_policy="shift",
                  moe_parallel=mode, **SP2)
    assert_identical(outputs, reference)


def test_a_tp_degree_the_experts_width_does_not_split_is_refused(tmp_path):
    """Experts 34 wide hold 2 chunks, not the 4 of TP = 4 (under EP too: one canonical order
    for both modes); refused before any worker starts."""
    shape = tmp_path / "qwen3-moe-34.json"
    cfg = tiny_config("qwen3-moe").to_dict()
    shape.write_text(json.dumps({**cfg, "moe_intermediate_size": 34,
                                 "architectures": ["Qwen3MoeForCausalLM"]}))
    with pytest.raises(ValueError, match=r"tp = 4, which does not divide the 2 K chunks .*"
                                         r"MLP widths \[128, 34\] allow: \[1, 2\]"):
        LLM(str(shape), **{**COMMON, "tensor_parallel_size": 4, "moe_parallel": "ep"})
