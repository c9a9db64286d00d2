"""The start-up check of a mixture-of-experts model against a plan names valid degrees."""
import pytest

from parashift.models.moe import check_plan, dense_intermediate_size
from parashift.parallel.plan import Plan
from tests.helpers.tiny_configs import tiny_config


def test_qwen3_30b_a3b_sizes_fit_tp_and_ep_up_to_eight():
    from transformers import Qwen3MoeConfig
    cfg = Qwen3MoeConfig(num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                         num_attention_heads=32, num_key_value_heads=4, num_hidden_layers=48)
    for plan in (Plan(tp=8), Plan(sp=2, tp=4), Plan(tp=2).shift_plan(), Plan(sp=8)):
        check_plan(plan, cfg, "tp")
        check_plan(plan, cfg, "ep")


def test_experts_that_do_not_split_name_the_valid_degrees():
    cfg = tiny_config("mixtral")  # 4 experts of width 32
    check_plan(Plan(tp=4), cfg, "ep")
    with pytest.raises(ValueError, match=r"4 experts cannot be split over the sp\*tp = 3 .*"
                                         r"\[1, 2, 4\]"):
        check_plan(Plan(sp=3), cfg, "ep")
    with pytest.raises(ValueError, match=r"intermediate size 32 cannot be split over tp = 3; "
                                         r"valid tp degrees: \[1, 2, 4, 8, 16, 32\]"):
        check_plan(Plan(tp=3), cfg, "tp")


def test_top_k_beyond_the_experts_is_refused():
    cfg = tiny_config("mixtral")
    cfg.num_experts_per_tok = 5
    with pytest.raises(ValueError, match="num_experts_per_tok = 5 must be in 1..4"):
        check_plan(Plan(), cfg, "tp")


def test_dense_mlp_width_checked_only_where_there_are_dense_layers():
    assert dense_intermediate_size(tiny_config("mixtral")) is None
    assert dense_intermediate_size(tiny_config("qwen3-moe")) == 128  # layer 1 is dense
    assert dense_intermediate_size(tiny_config("llama-gqa-untied")) == 128
