"""Narrowed weight layouts of several widths on one rank (merged plans of width 2 and 4, or
2 and 3): one permutation at load serves every reorder width that nests, each such layout
one contiguous view; the others keep views of the permuted rows. Every layout computes what
a plain slice of the loaded shard computes, and so does the base plan."""
import logging

import pytest
import torch

from parashift.context import StepContext, use_context, use_state
from parashift.models.llama import LlamaAttention, LlamaMLP
from parashift.parallel.narrow_weights import Narrowing, make_narrow_weights, moved_rows
from tests.parallel.test_shift_weights import HIDDEN, cfg, tp_state

BASE = "base"


def attention_and_mlp(heads: int, kv: int, inter: int = 48):
    """LlamaAttention (its attention replaced by a capture of q, k, v) and LlamaMLP with
    seeded random weights, on one rank of TP=1."""
    state = tp_state(1, 0)
    c = cfg(heads, kv, bias=True)
    c.intermediate_size = inter
    with use_state(state):
        attn, mlp = LlamaAttention(c, 64), LlamaMLP(c)
    torch.manual_seed(0)
    for p in [*attn.parameters(), *mlp.parameters()]:
        p.data.normal_()
    attn.attn = Capture()
    return state, torch.nn.ModuleList([attn, mlp])


class Capture(torch.nn.Module):
    def forward(self, positions, q, k, v):
        self.seen = (q, k, v)
        return q


def outputs(model, state, key: str, x: torch.Tensor):
    """q, k, v and the MLP output under the layout `key`."""
    attn, mlp = model
    with use_context(StepContext(state, key)):
        attn(torch.arange(len(x)), x)
        return (*attn.attn.seen, mlp(x))


def merges(widths: dict[int, int], mode: str) -> dict[str, Narrowing]:
    """Merged layouts by key, from {width: this rank's position}."""
    return {f"merge{w}.{p}": Narrowing(w, p, mode) for w, p in widths.items()}


def check_against_views(heads: int, kv: int, widths: dict[int, int], mode: str):
    """Each layout (and the base plan) computes what a lone view layout of the unpermuted
    shard computes; returns the model under test."""
    state, model = attention_and_mlp(heads, kv)
    x = torch.randn(5, HIDDEN)
    before = outputs(model, state, BASE, x)
    make_narrow_weights(model, merges(widths, mode), report=False)
    for key, need in merges(widths, "view").items():
        _, reference = attention_and_mlp(heads, kv)
        make_narrow_weights(reference, {key: need}, report=False)
        for got, want in zip(outputs(model, state, key, x), outputs(reference, state, key, x)):
            assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5)
    for got, want in zip(outputs(model, state, BASE, x), before):
        assert torch.allclose(got, want, atol=1e-5)
    return model


def one_view(layer, key: str) -> bool:
    """The layout is one contiguous view of the layer's resident weight (one GEMM)."""
    parts = layer.layouts[key]
    return (len(parts) == 1 and parts[0][0].is_contiguous()
            and parts[0][0].untyped_storage().data_ptr() == layer.weight.untyped_storage().data_ptr())


@pytest.mark.parametrize("widths", [{2: 1, 4: 2}, {2: 0, 4: 3}, {2: 1, 4: 1}])
def test_nested_widths_share_one_permutation(widths):
    """Widths 2 and 4 (any positions: rank 2 is slice 0 of its width-2 group and slice 2 of
    the width-4 one): both layouts of both fused projections are one view."""
    model = check_against_views(8, 4, widths, "reorder")
    attn, mlp = model
    for layer in (attn.qkv_proj, mlp.gate_up_proj):
        for key in merges(widths, "reorder"):
            assert one_view(layer, key)
        with use_state(tp_state(1, 0)):
            assert layer.output_split()[0] == 4  # the base plan reads the finest blocks
        with use_context(StepContext(tp_state(1, 0), "merge2." + str(widths[2]))):
            assert layer.output_split()[0] == 2


def test_one_three_nest():
    model = check_against_views(6, 3, {3: 2}, "reorder")
    assert one_view(model[0].qkv_proj, "merge3.2") and one_view(model[1].gate_up_proj, "merge3.2")


def test_widths_that_do_not_nest_keep_views_for_one(caplog):
    """2 and 3 on one rank: the rows are laid out for 3, the width-2 layout is views of the
    permuted rows (several GEMMs), and one warning names it."""
    state, model = attention_and_mlp(12, 6)
    with caplog.at_level(logging.WARNING):
        make_narrow_weights(model, merges({2: 1, 3: 1}, "reorder"))
    assert len([r for r in caplog.records if "keep views" in r.getMessage()]) == 1
    assert "merge2.1" in caplog.text and "merge3.1" not in caplog.text.split("keep views")[1]
    check_against_views(12, 6, {2: 1, 3: 1}, "reorder")
    attn, mlp = model
    assert one_view(attn.qkv_proj, "merge3.1") and not one_view(attn.qkv_proj, "merge2.1")


def test_shared_kv_heads_reorder_at_the_width_they_allow():
    """8 heads and 2 KV heads: width 4's blocks share KV heads, so the q/k/v rows are laid out
    for width 2 (width 4 keeps views there); gate/up has no KV and serves both."""
    model = check_against_views(8, 2, {2: 1, 4: 2}, "reorder")
    attn, mlp = model
    assert one_view(attn.qkv_proj, "merge2.1") and not one_view(attn.qkv_proj, "merge4.2")
    assert one_view(mlp.gate_up_proj, "merge2.1") and one_view(mlp.gate_up_proj, "merge4.2")


@pytest.mark.parametrize("mode", ["view", "materialize"])
def test_view_and_materialize_leave_the_rows_in_loading_order(mode):
    state, model = attention_and_mlp(8, 4)
    loaded = [p.detach().clone() for p in model.parameters()]
    extra = make_narrow_weights(model, merges({2: 1, 4: 2}, mode), report=False)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), loaded))
    qkv = model[0].qkv_proj
    if mode == "materialize":  # one contiguous copy per layout, of its share of the rows
        assert extra > 0 and not one_view(qkv, "merge4.2") and len(qkv.layouts["merge4.2"]) == 1
        assert qkv.layouts["merge2.1"][0][0].shape[0] == qkv.weight.shape[0] // 2
    else:
        assert extra == 0 and len(qkv.layouts["merge4.2"]) == 3  # q, k and v views
    check_against_views(8, 4, {2: 1, 4: 2}, mode)


def test_moved_rows_follow_the_permutation():
    order = [(0, 2), (6, 2), (2, 2), (8, 2), (4, 2), (10, 2)]  # rows 0..11 in 3 segments
    assert moved_rows([(0, 4)], order) == [(0, 2), (4, 2)]
    assert moved_rows([(6, 4)], order) == [(2, 2), (6, 2)]
    assert moved_rows([(1, 1), (6, 1)], order) == [(1, 2)]  # adjacent once moved: joined
    assert moved_rows([(3, 5)], None) == [(3, 5)]


def test_rows_are_permuted_in_place_through_one_unit_of_scratch():
    """permute_rows moves the rows cycle by cycle (fixed points, several cycles) in the
    weight's own storage, to what a gather of the ranges gives."""
    state, model = attention_and_mlp(8, 4)
    layer = model[1].gate_up_proj  # 2 x 48 rows
    loaded, storage = layer.weight.detach().clone(), layer.weight.untyped_storage().data_ptr()
    rows = [(0, 12), (48, 12), (36, 12), (24, 12), (60, 36), (12, 12)]  # a fixed point, cycles
    layer.permute_rows(rows, (1, [96]))
    assert torch.equal(layer.weight, torch.cat([loaded[o:o + n] for o, n in rows]))
    assert layer.weight.untyped_storage().data_ptr() == storage
