"""Shift weights on one process: a rank's base TP shard (fake TP groups, no communication)
and its shift layouts. `reorder` permutes each fused column-parallel shard so that every
SP rank's shift rows are one contiguous block; the shift layout is then one view with no
extra bytes, and the base plan still computes the same function."""
from types import SimpleNamespace

import pytest
import torch

from parashift.context import BASE_WEIGHTS, StepContext, use_context, use_state
from parashift.layers.activation import SiluAndMul, silu_and_mul_torch
from parashift.layers.linear import (MergedColumnParallelLinear, QKVParallelLinear,
                                     RowParallelLinear)
from parashift.models.llama import LlamaAttention, LlamaMLP
from parashift.parallel.narrow_weights import (SHIFT_MODE_NAMES, Narrowing, make_layer_layouts,
                                               make_narrow_weights, moved_rows)
from parashift.parallel.shift_weights import SHIFT_WEIGHTS, reorder_rows, shift_rows
from tests.helpers.fake_groups import tp_state

HIDDEN, D = 32, 4


def cfg(heads: int, kv_heads: int, bias: bool = False):
    return SimpleNamespace(hidden_size=HIDDEN, head_dim=D, num_attention_heads=heads,
                           num_key_value_heads=kv_heads, intermediate_size=48,
                           model_type="qwen2" if bias else "llama", rms_norm_eps=1e-6,
                           rope_theta=10000.0, mlp_bias=bias, attention_bias=False)


def qkv_layer(state, heads, kv_heads, bias=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    with use_state(state):
        layer = QKVParallelLinear(HIDDEN, D, heads, kv_heads, bias=bias)
    for shard, n in (("q", heads), ("k", kv_heads), ("v", kv_heads)):
        layer.weight_loader(layer.weight, torch.randn(n * D, HIDDEN, generator=g), shard)
        if bias:
            layer.weight_loader(layer.bias, torch.randn(n * D, generator=g), shard)
    return layer


def gate_up_layer(state, inter=48, bias=False, seed=1):
    g = torch.Generator().manual_seed(seed)
    with use_state(state):
        layer = MergedColumnParallelLinear(HIDDEN, [inter] * 2, bias=bias)
    for shard in (0, 1):
        layer.weight_loader(layer.weight, torch.randn(inter, HIDDEN, generator=g), shard)
        if bias:
            layer.weight_loader(layer.bias, torch.randn(inter, generator=g), shard)
    return layer


def make_layer_shift_weights(layer, sp: int, sp_rank: int, mode: str) -> tuple[int, str]:
    """The shift layout under --shift-weights' `mode`: (extra bytes, the mode used)."""
    extra, used = make_layer_layouts(layer, {SHIFT_WEIGHTS: Narrowing(sp, sp_rank,
                                                                      SHIFT_MODE_NAMES[mode])})
    return extra, {v: k for k, v in SHIFT_MODE_NAMES.items()}[used[SHIFT_WEIGHTS]]


def make_shift_weights(model, sp: int, sp_rank: int, mode: str) -> int:
    return make_narrow_weights(model, {SHIFT_WEIGHTS: Narrowing(sp, sp_rank,
                                                                SHIFT_MODE_NAMES[mode])}, False)


def rows_of(t: torch.Tensor, rows) -> torch.Tensor:
    return torch.cat([t.narrow(0, o, n) for o, n in rows])


# (heads, kv heads, TP, SP): KV heads split over SP, or shared by SP ranks (fallback)
DISJOINT = [(8, 2, 1, 2), (6, 3, 1, 3), (8, 4, 2, 2), (16, 8, 2, 2), (8, 8, 1, 4)]
SHARED = [(8, 2, 1, 4), (8, 2, 2, 2)]


@pytest.mark.parametrize("heads, kv, tp, sp", DISJOINT)
@pytest.mark.parametrize("bias", [False, True])
def test_reorder_is_a_permutation_and_its_inverse_restores_the_shard(heads, kv, tp, sp, bias):
    for tp_rank in range(tp):
        layer = qkv_layer(tp_state(tp, tp_rank), heads, kv, bias)
        loaded = layer.weight.detach().clone()
        order = reorder_rows(layer, sp)
        assert order is not None
        assert sorted(i for o, n in order for i in range(o, o + n)) == list(range(loaded.shape[0]))
        permuted = rows_of(loaded, order)
        assert torch.equal(rows_of(permuted, moved_rows([(0, loaded.shape[0])], order)), loaded)
        # block s of the permuted shard is SP rank s's slice rows, in segment order
        block = loaded.shape[0] // sp
        for s in range(sp):
            assert torch.equal(permuted[s * block:(s + 1) * block],
                               rows_of(loaded, shift_rows(layer, sp, s)))


@pytest.mark.parametrize("heads, kv, tp, sp", SHARED)
def test_shared_kv_heads_fall_back_to_slice(heads, kv, tp, sp):
    layer = qkv_layer(tp_state(tp, 0), heads, kv)
    loaded = layer.weight.detach().clone()
    assert reorder_rows(layer, sp) is None
    extra, used = make_layer_shift_weights(layer, sp, 1, "reorder")
    assert (extra, used) == (0, "slice")
    assert torch.equal(layer.weight, loaded)  # the base shard keeps its loading order
    assert len(layer.layouts[SHIFT_WEIGHTS]) == 3
    with use_state(tp_state(tp, 0)):
        assert layer.output_split()[0] == 1


def _shift_context(state):
    return use_context(StepContext(state, SHIFT_WEIGHTS))


@pytest.mark.parametrize("heads, kv, tp, sp", DISJOINT)
def test_shift_view_is_one_contiguous_view_equal_to_the_slice_parts(heads, kv, tp, sp):
    state = tp_state(tp, tp - 1)
    x = torch.randn(5, HIDDEN)
    for make, bias in ((lambda b: qkv_layer(state, heads, kv, b), True),
                       (lambda b: gate_up_layer(state, bias=b), True)):
        for sp_rank in range(sp):
            sliced, reordered = make(bias), make(bias)
            assert make_layer_shift_weights(sliced, sp, sp_rank, "slice") == (0, "slice")
            assert make_layer_shift_weights(reordered, sp, sp_rank, "reorder") == (0, "reorder")
            [(weight, b, _)] = reordered.layouts[SHIFT_WEIGHTS]
            assert weight.is_contiguous() and b.is_contiguous()
            # a view of the base weight: same storage, no extra bytes
            assert weight.untyped_storage().data_ptr() == reordered.weight.untyped_storage().data_ptr()
            assert torch.equal(weight, torch.cat([p.weight for p in sliced.layouts[SHIFT_WEIGHTS]]))
            assert torch.equal(b, torch.cat([p.bias for p in sliced.layouts[SHIFT_WEIGHTS]]))
            with _shift_context(state):
                assert torch.allclose(reordered(x), sliced(x), atol=1e-5)
                assert reordered.output_split() == sliced.output_split()
                assert reordered.output_split()[0] == 1


def test_separate_copies_and_reorder_takes_no_extra_bytes():
    state = tp_state(2, 0)
    for mode, expect_extra in (("separate", True), ("slice", False), ("reorder", False)):
        with use_state(state):
            mlp, attn = LlamaMLP(cfg(8, 4)), LlamaAttention(cfg(8, 4), 64)
        model = torch.nn.ModuleList([mlp, attn])
        before = {n: p.untyped_storage().data_ptr() for n, p in model.named_parameters()}
        extra = make_shift_weights(model, 2, 1, mode)
        shard = sum(p.nbytes for p in model.parameters())
        assert (extra > 0) == expect_extra
        if expect_extra:
            assert extra == shard // 2  # w / (SP x TP) of the whole model, on each rank
        # the base parameters keep their storage (permuted in place)
        assert before == {n: p.untyped_storage().data_ptr() for n, p in model.named_parameters()}


@pytest.mark.parametrize("heads, kv, tp, sp", DISJOINT + SHARED)
def test_base_plan_computes_the_same_function_after_reorder(heads, kv, tp, sp):
    """The base plan's q, k, v (LlamaAttention's split) and MLP output are unchanged."""
    state = tp_state(tp, tp - 1)
    c = cfg(heads, kv, bias=True)
    x = torch.randn(6, HIDDEN)
    with use_state(state):
        attn, mlp = LlamaAttention(c, 64), LlamaMLP(c)
    torch.manual_seed(0)
    for p in [*attn.parameters(), *mlp.parameters()]:
        p.data.normal_()
    seen = []

    class Capture(torch.nn.Module):
        def forward(self, positions, q, k, v):
            seen.append((q.clone(), k.clone(), v.clone()))
            return q

    attn.attn = Capture()
    positions = torch.arange(6)
    with use_state(state):
        ref_mlp, _ = mlp(x), attn(positions, x)
        make_shift_weights(torch.nn.ModuleList([attn, mlp]), sp, 0, "reorder")
        assert mlp.gate_up_proj.output_split()[0] == sp
        out_mlp, _ = mlp(x), attn(positions, x)
    assert torch.allclose(out_mlp, ref_mlp, atol=1e-5)
    for before, after in zip(*seen):
        assert before.shape == after.shape and torch.allclose(before, after, atol=1e-5)


def test_silu_and_mul_over_blocks():
    x = torch.randn(3, 4, 2 * 5)  # [T, blocks, gate | up]
    out = SiluAndMul()(x.flatten(1), blocks=4)
    assert torch.equal(out, silu_and_mul_torch(x).flatten(1))


def test_row_parallel_shift_view_is_the_column_slice():
    state = tp_state(2, 1)
    with use_state(state):
        layer = RowParallelLinear(48, HIDDEN)
    layer.weight_loader(layer.weight, torch.randn(HIDDEN, 48))
    assert make_layer_shift_weights(layer, 2, 1, "reorder") == (0, "reorder")
    [(weight, _, _)] = layer.layouts[SHIFT_WEIGHTS]
    assert torch.equal(weight, layer.weight[:, 12:])


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="reorder"):
        Narrowing(2, 0, "views")
    with pytest.raises(ValueError, match="slice 2 of 2"):
        Narrowing(2, 2, "view")
    assert BASE_WEIGHTS != SHIFT_WEIGHTS


def test_rows_are_reordered_once():
    layer = gate_up_layer(tp_state(1, 0))
    make_layer_shift_weights(layer, 2, 0, "reorder")
    with pytest.raises(RuntimeError, match="reordered already"):
        make_layer_shift_weights(layer, 2, 0, "reorder")
