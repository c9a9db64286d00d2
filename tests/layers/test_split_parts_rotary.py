"""The split-K QKV GEMM whose parts the rotary kernel after it sums
(layers/split_parts_rotary.py): which blocks are wired (CPU), the handoff by views of the very
tensor, the switch read at each call, the hook -> twin flow with the GPU stood in by torch,
and on the GPU (PARASHIFT_TEST_DEVICE=cuda) an engine's greedy tokens with the parts forced
equal to those of the same split config summed by tickets, bf16 and FP8, at 40 rows."""
import os
from types import SimpleNamespace

import pytest
import torch

from parashift.context import use_state
from parashift.kernels import split_parts_choice, split_parts_rotary_choice
from parashift.layers.attention import Attention
from parashift.layers.rotary import apply_rotary_torch
from parashift.layers.split_parts_rotary import PartsAttention, QKVPartsHandoff, \
    QKVPartsHook, finished_in_torch
from parashift.models.llama import LlamaForCausalLM
from parashift.parallel.state import ParallelState
from parashift.quantization.scheme import WeightQuant
from tests.engine.conftest import tiny_llama_dir  # noqa: F401  (shared fixture)
from tests.helpers.switch_tokens import switch_tokens
from tests.helpers.tiny_configs import TINY, tiny_config
from tests.layers.test_split_parts_norm import TicketTwins

DEVICE = os.environ.get("PARASHIFT_TEST_DEVICE", "cpu")
ROWS = 40


def build(quantization=None, family="llama-gqa-untied", seed=None):
    with use_state(ParallelState.single(), quantization=quantization):
        model = LlamaForCausalLM(tiny_config(family), 64)
    if seed is not None:
        gen = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            p.data.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return model


@pytest.mark.parametrize("quantization", [None, WeightQuant()], ids=["bf16", "fp8"])
def test_each_attention_and_its_qkv_are_wired(quantization):
    for layer in build(quantization).model.layers:
        assert type(layer.self_attn.attn) is PartsAttention
        assert isinstance(layer.self_attn.qkv_proj.gemm_hook, QKVPartsHook)


@pytest.mark.parametrize("family", ["qwen3-qk-norm-head-dim", "qwen2-qkv-bias"])
def test_blocks_with_qk_norms_or_a_qkv_bias_are_not_wired(family):
    for layer in build(family=family).model.layers:
        assert type(layer.self_attn.attn) is Attention
        assert layer.self_attn.qkv_proj.gemm_hook is None


def head_views(qkv, q_heads=4, k_heads=2, head_dim=16):
    return qkv.unflatten(-1, (-1, head_dim)).split([q_heads, k_heads, k_heads], dim=-2)


def test_handoff_gives_the_parts_for_the_very_tensors_views_only():
    handoff, qkv, parts = QKVPartsHandoff(), torch.empty(3, 128), (torch.zeros(2, 3, 128),)
    assert handoff.take(*head_views(qkv)) is None
    handoff.put(qkv, parts)
    assert handoff.take(*head_views(qkv)) == (qkv, parts)
    assert handoff.take(*head_views(qkv)) is None  # taken once
    for other in (qkv.clone(), torch.empty(3, 256)[:, :128]):
        handoff.put(qkv, parts)
        with pytest.raises(RuntimeError, match="another tensor"):
            handoff.take(*head_views(other))
    q, k, v = head_views(qkv)
    handoff.put(qkv, parts)
    with pytest.raises(RuntimeError, match="another tensor"):
        handoff.take(q, v, k)  # not [q | k | v]


def test_switch_is_read_at_each_call_and_checked(monkeypatch):
    qkv_proj = build().model.layers[0].self_attn.qkv_proj
    hook, part = qkv_proj.gemm_hook, qkv_proj.part()
    monkeypatch.setenv(split_parts_rotary_choice.ENV, "yes")
    with pytest.raises(ValueError, match="PARASHIFT_SPLIT_PARTS_ROTARY='yes'"):
        hook.take(torch.randn(ROWS, 64), part)
    monkeypatch.setenv(split_parts_rotary_choice.ENV, "1")
    monkeypatch.setattr(split_parts_rotary_choice, "choice",
                        lambda *args: pytest.fail("asked on the CPU"))
    assert hook.take(torch.randn(ROWS, 64), part) is None  # the CPU: the plain GEMM


def test_finished_in_torch_sums_in_part_order_then_scales():
    parts = torch.tensor([[[1e8, 1.0]], [[-1e8, 3.0]], [[1.0, 5.0]]])
    w_scale, x_scale = torch.tensor([[2.0], [0.5]]), torch.tensor([[3.0]])
    out = finished_in_torch(parts, w_scale, x_scale, torch.float32)
    assert out.tolist() == [[6.0, 13.5]]  # (1e8 - 1e8) + 1 first: not 1e8 + (-1e8 + 1)


@pytest.fixture
def gpu_stand_ins(monkeypatch):
    """The GPU path on the CPU: the parts chosen, K split in two by torch; the summing rotary
    kernel by torch (the rotated q only); the attention of the rotated q returned as is."""
    from parashift.attention import rotate_attend
    from parashift.kernels import parts_rotary
    from parashift.layers import split_parts_rotary
    summed = []

    def parts_of(x, weight, scale, config, x_fp8=None):
        half = x.shape[1] // 2
        return (torch.stack([x[:, :half] @ weight[:, :half].t(),
                             x[:, half:] @ weight[:, half:].t()]).float(), None, None)

    def rotate_parts(positions, parts, w_scale, x_scale, q_heads, dtype, cos_sin, *pools):
        summed.append(parts)
        q, k, _ = head_views(finished_in_torch(parts, w_scale, x_scale, dtype))
        return apply_rotary_torch(positions, q, k, cos_sin)[0]

    def rotate_write_attend(backend, positions, q, k, v, cos_sin, k_cache, v_cache, meta,
                            scale, norms, rotate):
        return rotate(positions, q, k, v, cos_sin, k_cache, v_cache, None, norms)

    monkeypatch.setenv(split_parts_rotary_choice.ENV, "1")
    monkeypatch.setattr(split_parts_rotary, "use_triton", lambda x: True)
    monkeypatch.setattr(split_parts_rotary, "get_attention_context",
                        lambda: SimpleNamespace(backend=None, attn=None))
    monkeypatch.setattr(PartsAttention, "rotates_parts", lambda self, q: True)
    monkeypatch.setattr(split_parts_choice, "serves", lambda *args: True)
    monkeypatch.setattr(split_parts_rotary_choice, "choice", lambda *args: "cfg")
    monkeypatch.setattr(split_parts_rotary_choice, "parts_of", parts_of)
    monkeypatch.setattr(parts_rotary, "rotate_parts_and_write_kv", rotate_parts)
    monkeypatch.setattr(rotate_attend, "rotate_write_attend", rotate_write_attend)
    return summed


def test_the_qkv_layer_hands_its_parts_to_the_rotary_kernel(gpu_stand_ins, monkeypatch):
    """qkv_proj returns an unwritten tensor; the twin, called with its head views, rotates
    the parts it was handed: the rotated q of the plain GEMM's output."""
    block = build(seed=0).model.layers[0].self_attn
    x, positions = torch.randn(ROWS, 64), torch.arange(ROWS)
    expected = apply_rotary_torch(positions, *head_views(x @ block.qkv_proj.weight.t())[:2],
                                  block.attn.rotary_emb.cos_sin)[0]
    out = block.attn(positions, *head_views(block.qkv_proj(x)))
    assert len(gpu_stand_ins) == 1 and gpu_stand_ins.pop().shape == (2, ROWS, 128)
    torch.testing.assert_close(out, expected)
    with pytest.raises(RuntimeError, match="another tensor"):
        block.qkv_proj(x)
        block.attn(positions, *head_views(x @ block.qkv_proj.weight.t()))


def test_a_step_that_rotates_in_the_attention_kernel_gets_the_written_tensor(
        gpu_stand_ins, monkeypatch):
    """The step's path changed between the hook and the twin: the twin writes the tensor
    (the parts summed) before the plain attention reads it."""
    block = build(seed=0).model.layers[0].self_attn
    x, positions = torch.randn(ROWS, 64), torch.arange(ROWS)
    qkv = block.qkv_proj(x)
    monkeypatch.setattr(PartsAttention, "rotates_parts", lambda self, q: False)
    seen = []
    monkeypatch.setattr(Attention, "forward", lambda self, p, q, k, v: seen.append(q) or q)
    block.attn(positions, *head_views(qkv))
    torch.testing.assert_close(seen[0], head_views(x @ block.qkv_proj.weight.t())[0])


def test_the_hook_stays_idle_where_the_attention_rotates_in_its_kernel_or_a_hook_sits(
        gpu_stand_ins, monkeypatch):
    block = build(seed=0).model.layers[0].self_attn
    x = torch.randn(ROWS, 64)
    handle = block.attn.register_forward_pre_hook(lambda module, args: None)
    torch.testing.assert_close(block.qkv_proj(x), x @ block.qkv_proj.weight.t())
    handle.remove()
    monkeypatch.setattr(PartsAttention, "rotates_parts", lambda self, q: False)
    torch.testing.assert_close(block.qkv_proj(x), x @ block.qkv_proj.weight.t())
    assert not gpu_stand_ins


@pytest.fixture(scope="module")
def engine_tokens(tiny_llama_dir):
    """tokens(quantization, value): greedy tokens with PARASHIFT_SPLIT_PARTS_ROTARY=value,
    40 sequences a step (decode's 64-row bucket)."""
    return switch_tokens(tiny_llama_dir, DEVICE, split_parts_rotary_choice.ENV, prompts=ROWS,
                         max_num_seqs=64)


@pytest.mark.skipif(DEVICE != "cuda", reason="needs PARASHIFT_TEST_DEVICE=cuda")
@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_parts_engine_gives_the_ticket_path_tokens(engine_tokens, monkeypatch, quantization):
    """Each QKV at 40 rows on a split-K config's parts (whatever they time) gives the tokens
    of the same config summed by tickets with the plain rotary kernel: the same bits."""
    from parashift.kernels import dense_gemm, fp8_gemm
    fp8 = quantization == "fp8"
    chooser = split_parts_rotary_choice
    parts = (chooser.FP8_CONFIGS if fp8 else chooser.DENSE_CONFIGS)[0]
    ticket = fp8_gemm.Config(**{**parts.__dict__, "tickets": True}) if fp8 else parts
    head_dim = TINY["hidden_size"] // TINY["num_attention_heads"]
    shapes = {((TINY["num_attention_heads"] + 2 * TINY["num_key_value_heads"]) * head_dim,
               TINY["hidden_size"])}
    gemm = fp8_gemm if fp8 else dense_gemm
    asked = set()
    monkeypatch.setattr(chooser, "choice",
                        lambda x, weight, *args: asked.add(tuple(weight.shape)) or parts)
    on = engine_tokens(quantization, "1")
    twins = TicketTwins(gemm._choices, shapes, gemm.row_bucket(ROWS), ticket)
    monkeypatch.setattr(gemm, "_choices", twins)
    assert on == engine_tokens(quantization, "0")
    assert asked == shapes and twins.used == shapes


def test_outside_a_step_the_attention_takes_no_parts():
    """A QKV GEMM run with no attention metadata (a benchmark calling the layer) gets its
    plain output, not an error."""
    attn = build().model.layers[0].self_attn.attn
    assert not attn.rotates_parts(torch.empty(ROWS, 4, 16))
