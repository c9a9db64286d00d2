"""SiLU-and-mul formed by FP8 gate_up's GEMM at 16-64 rows (layers/fp8_gated_silu.py): which
models get the twin, the hand-over of the product and its E4M3 rows (CPU, the GPU's kernels
stood in by torch), the switch read at each call, and on the GPU (PARASHIFT_TEST_DEVICE=cuda)
an engine's greedy tokens at 20 sequences with the fusion forced equal to those without."""
import os

import pytest
import torch
import torch.nn.functional as F

from parashift.kernels import fp8_gated_choice, fp8_gemm
from parashift.layers import fp8_gated_silu
from parashift.layers.activation import silu_and_mul_torch
from parashift.layers.fp8_gated_silu import FP8GateUpHook, SiluInFP8GateUp
from parashift.quantization.scheme import WeightQuant
from tests.engine.conftest import tiny_llama_dir  # noqa: F401  (shared fixture)
from tests.helpers.switch_tokens import engine_tokens
from tests.layers.test_silu_gemv import build

DEVICE = os.environ.get("PARASHIFT_TEST_DEVICE", "cpu")


def twins(model) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, SiluInFP8GateUp)]


def test_fp8_mlps_get_the_twin_and_gate_up_the_hook(monkeypatch):
    monkeypatch.delenv("PARASHIFT_FP8_FUSED_INPUT", raising=False)
    model = build(WeightQuant())
    assert twins(model) == [f"model.layers.{i}.mlp.act" for i in range(len(model.model.layers))]
    for layer in model.model.layers:
        assert isinstance(layer.mlp.gate_up_proj.gemm_hook, FP8GateUpHook)
        assert layer.mlp.down_proj.fp8_input is layer.mlp.act.handoff
    assert fp8_gated_silu.fuse_silu_into_fp8_gate_up(model) == 0  # not replaced again
    assert not twins(build())  # bf16: no quantizing SiLU-and-mul
    assert not twins(build(WeightQuant(), reduction_chunks=4))  # deterministic mode
    monkeypatch.setenv("PARASHIFT_FP8_FUSED_INPUT", "0")
    assert not twins(build(WeightQuant()))


def quantized_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = x.abs().amax(1, keepdim=True).clamp(min=1e-12) / fp8_gemm.FP8_MAX
    return (x / scale).to(fp8_gemm.FP8), scale


@pytest.fixture
def fp8_mlp(monkeypatch):
    """An FP8 MLP on the CPU as the GPU runs it at 16-64 rows: the choice taking the fusion
    from MIN_ROWS rows, the fused kernels by torch (calls recorded), down's hand-over
    recorded; (mlp, calls, handed)."""
    monkeypatch.delenv("PARASHIFT_FP8_FUSED_INPUT", raising=False)
    mlp = build(WeightQuant()).model.layers[0].mlp
    gen = torch.Generator().manual_seed(0)
    for layer in (mlp.gate_up_proj, mlp.down_proj):
        layer.weight.data.copy_((torch.randn(layer.weight.shape, generator=gen) * 8).to(
            fp8_gemm.FP8))
        layer.weight_scale.data.fill_(0.02)
    calls, handed = [], []

    def fused(x_fp8, weight, scale, out_dtype, tiling):
        calls.append((x_fp8, tiling))
        x = x_fp8[0].float() * x_fp8[1]
        out = silu_and_mul_torch(F.linear(x, weight.float() * scale)).to(out_dtype)
        return (out, *quantized_rows(out))
    monkeypatch.setattr(fp8_gated_silu, "use_triton", lambda x: True)
    monkeypatch.setattr(mlp.act, "hands_over", lambda x: True)  # down quantizes its input
    monkeypatch.setattr(fp8_gated_choice, "choice", lambda x, *args: "tiling" if x.shape[0] >=
                        fp8_gated_choice.MIN_ROWS else None)
    monkeypatch.setattr(fp8_gated_choice, "fused", fused)
    take = mlp.down_proj.fp8_input.take
    monkeypatch.setattr(mlp.down_proj.fp8_input, "take",
                        lambda x: handed.append(take(x)) or handed[-1])
    return mlp, calls, handed


def run(mlp, rows: int) -> tuple[torch.Tensor, torch.Tensor, tuple]:
    """(the MLP's output for `rows` rows, the plain ops' on the same E4M3 input, its input's
    rows handed to gate_up as the norm before hands them)."""
    x = torch.randn(rows, mlp.gate_up_proj.weight.shape[1],
                    generator=torch.Generator().manual_seed(rows))
    x_fp8 = quantized_rows(x)
    xin = x_fp8[0].float() * x_fp8[1]
    gate_up = mlp.gate_up_proj.weight.float() * mlp.gate_up_proj.weight_scale
    down = mlp.down_proj.weight.float() * mlp.down_proj.weight_scale
    expected = F.linear(silu_and_mul_torch(F.linear(xin, gate_up)), down)
    mlp.gate_up_proj.fp8_input.put(xin, *x_fp8)
    return mlp(xin), expected, x_fp8


def test_gate_up_hands_the_product_and_its_rows_to_down(monkeypatch, fp8_mlp):
    mlp, calls, handed = fp8_mlp
    monkeypatch.setenv(fp8_gated_silu.ENV, "1")
    out, expected, x_fp8 = run(mlp, fp8_gated_choice.MIN_ROWS)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert len(calls) == 1 and calls[0][0] == x_fp8 and calls[0][1] == "tiling"
    assert handed[-1] is not None and handed[-1][0].dtype == fp8_gemm.FP8
    assert mlp.act.made is None  # taken once
    out, expected, _ = run(mlp, fp8_gated_choice.MIN_ROWS - 1)  # not chosen: the plain ops
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert len(calls) == 1


def test_on_by_default_and_read_at_each_call(monkeypatch, fp8_mlp):
    mlp, calls, _ = fp8_mlp
    monkeypatch.setenv(fp8_gated_silu.ENV, "0")
    out, expected, _ = run(mlp, 8)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert not calls
    monkeypatch.delenv(fp8_gated_silu.ENV, raising=False)
    run(mlp, 8)
    assert len(calls) == 1
    monkeypatch.setenv(fp8_gated_silu.ENV, "yes")
    with pytest.raises(ValueError, match="PARASHIFT_FP8_GATE_UP_SILU='yes'"):
        run(mlp, 8)


def test_a_product_not_handed_on_is_not_taken(monkeypatch, fp8_mlp):
    """The twin called with another tensor than gate_up's product: the plain op."""
    mlp, calls, _ = fp8_mlp
    made = torch.zeros(2, 128), *quantized_rows(torch.ones(2, 128))
    mlp.act.made = made
    x = torch.randn(2, 256)
    torch.testing.assert_close(mlp.act(x), silu_and_mul_torch(x))
    assert mlp.act.made is None


@pytest.mark.skipif(DEVICE != "cuda", reason="needs PARASHIFT_TEST_DEVICE=cuda")
def test_the_fused_engine_gives_the_unfused_tokens_at_20_sequences(monkeypatch,
                                                                   tiny_llama_dir):
    """FP8 decode of 20 sequences with the TMA GEMM and the fusion forced (every margin
    infinite: no timing decides), against the switch off; the choice made in this process."""
    monkeypatch.setattr(fp8_gemm, "CONFIGS", ())
    monkeypatch.setattr(fp8_gemm, "TMA_CONFIGS", (fp8_gemm.Config(
        "tma_w8a8", 64, 128, 4, 3, 1, tickets=True),))
    monkeypatch.setattr(fp8_gemm, "MARGIN", float("inf"))
    monkeypatch.setattr(fp8_gated_choice, "MARGIN", float("inf"))
    monkeypatch.setattr(fp8_gemm, "_choices", {})  # chosen in this test, as forced
    monkeypatch.setattr(fp8_gated_choice, "_choices", {})
    prompts = [[(7 * i + 3 * j) % 500 + 1 for j in range(5 + i)] for i in range(20)]
    tokens = {flag: engine_tokens(tiny_llama_dir, "cuda", fp8_gated_silu.ENV, flag, prompts,
                                  quantization="fp8", max_num_seqs=20) for flag in ("0", "1")}
    assert any(c["kernel"] != "unfused" for c in fp8_gated_choice.chosen())
    assert tokens["1"] == tokens["0"]
