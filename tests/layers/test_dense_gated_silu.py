"""SiLU-and-mul formed by 16-bit gate_up's GEMM at 33-64 rows (layers/dense_gated_silu.py):
which layers get the hook, the hand-over of the product (CPU, the GPU's kernels stood in by
torch), the switch read at each call, and on the GPU (PARASHIFT_TEST_DEVICE=cuda) an
engine's greedy tokens at 40 sequences with the fusion forced equal to those without."""
import os

import pytest
import torch
import torch.nn.functional as F

from parashift.kernels import dense_gated_choice, dense_gemm, gated_gemv
from parashift.kernels.dense_gemm_tma import Config
from parashift.layers import dense_gated_silu, silu_gemv
from parashift.layers.activation import silu_and_mul_torch
from parashift.layers.dense_gated_silu import DenseGateUpHook
from parashift.quantization.scheme import WeightQuant
from tests.engine.conftest import tiny_llama_dir  # noqa: F401  (shared fixture)
from tests.helpers.switch_tokens import engine_tokens
from tests.layers.test_silu_gemv import build

DEVICE = os.environ.get("PARASHIFT_TEST_DEVICE", "cpu")


def hooked(model) -> list[str]:
    return [name for name, m in model.named_modules()
            if isinstance(getattr(m, "gemm_hook", None), DenseGateUpHook)]


def test_gate_up_layers_with_the_gemv_hook_get_the_dense_one(monkeypatch):
    monkeypatch.delenv(silu_gemv.ENV, raising=False)
    model = build()
    assert hooked(model) == [f"model.layers.{i}.mlp.gate_up_proj"
                             for i in range(len(model.model.layers))]
    assert dense_gated_silu.fuse_silu_into_dense_gate_up(model) == 0  # not swapped again
    assert not hooked(build(reduction_chunks=4))  # deterministic mode: no GEMV hook either
    monkeypatch.setenv(silu_gemv.ENV, "0")
    assert not hooked(build())


@pytest.fixture
def bf16_mlp(monkeypatch):
    """A 16-bit MLP on the CPU as the GPU runs it: the dense choice taking the fusion from
    MIN_ROWS rows, the GEMV's at up to 4, both kernels by torch (calls recorded);
    (mlp, calls)."""
    monkeypatch.delenv(silu_gemv.ENV, raising=False)
    mlp = build().model.layers[0].mlp
    gen = torch.Generator().manual_seed(0)
    for p in mlp.parameters():
        p.data.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    calls = []

    def fused(x, weight, tiling):
        calls.append(("dense", x.shape[0], tiling))
        return silu_and_mul_torch(F.linear(x, weight))

    def fused_linear(x, weight, scale, bias, config):
        calls.append(("gemv", x.shape[0], config))
        return silu_and_mul_torch(F.linear(x, weight, bias))
    monkeypatch.setattr(silu_gemv, "use_triton", lambda x: True)
    monkeypatch.setattr(dense_gated_choice, "choice", lambda x, *args: "tiling" if
                        x.shape[0] >= dense_gated_choice.MIN_ROWS else None)
    monkeypatch.setattr(dense_gated_choice, "fused", fused)
    monkeypatch.setattr(gated_gemv, "choice",
                        lambda x, *args: "cfg" if x.shape[0] <= 4 else None)
    monkeypatch.setattr(gated_gemv, "fused_linear", fused_linear)
    return mlp, calls


def run(mlp, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the MLP's output for `rows` rows, the plain ops')."""
    x = torch.randn(rows, mlp.gate_up_proj.weight.shape[1],
                    generator=torch.Generator().manual_seed(rows))
    expected = F.linear(silu_and_mul_torch(F.linear(x, mlp.gate_up_proj.weight)),
                        mlp.down_proj.weight)
    return mlp(x), expected


def test_gate_up_hands_the_product_to_the_twin(monkeypatch, bf16_mlp):
    mlp, calls = bf16_mlp
    monkeypatch.setenv(dense_gated_silu.ENV, "1")
    rows = dense_gated_choice.MIN_ROWS
    out, expected = run(mlp, rows)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert calls == [("dense", rows, "tiling")] and mlp.act.activated is None
    out, expected = run(mlp, 3)  # the GEMV hook's at 3 rows
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert calls[-1] == ("gemv", 3, "cfg")
    out, expected = run(mlp, rows - 1)  # neither: the plain ops
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert len(calls) == 2


def test_on_by_default_and_read_at_each_call(monkeypatch, bf16_mlp):
    mlp, calls = bf16_mlp
    monkeypatch.setenv(dense_gated_silu.ENV, "0")
    out, expected = run(mlp, 40)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert not calls
    monkeypatch.delenv(dense_gated_silu.ENV, raising=False)
    run(mlp, 40)
    assert calls == [("dense", 40, "tiling")]
    monkeypatch.setenv(dense_gated_silu.ENV, "yes")
    with pytest.raises(ValueError, match="PARASHIFT_DENSE_GATE_UP_SILU='yes'"):
        run(mlp, 40)


def test_fp8_weights_keep_their_gemms(monkeypatch, bf16_mlp):
    """An FP8 gate_up with the GEMV hook (PARASHIFT_FP8_FUSED_INPUT=0): never the dense
    fusion."""
    monkeypatch.setenv("PARASHIFT_FP8_FUSED_INPUT", "0")
    monkeypatch.setenv(dense_gated_silu.ENV, "1")
    gate_up = build(WeightQuant()).model.layers[0].mlp.gate_up_proj
    assert isinstance(gate_up.gemm_hook, DenseGateUpHook)
    part = gate_up._active_parts()[0]
    assert gate_up.gemm_hook.dense_tiling(torch.zeros(40, part.weight.shape[1]), part) is None


@pytest.mark.skipif(DEVICE != "cuda", reason="needs PARASHIFT_TEST_DEVICE=cuda")
def test_the_fused_engine_gives_the_unfused_tokens_at_40_sequences(monkeypatch,
                                                                   tiny_llama_dir):
    """bf16 decode of 40 sequences (33-64 rows) with the TMA GEMM and the fusion forced
    (every margin infinite: no timing decides), against the switch off; the choice made in
    this process."""
    monkeypatch.setattr(dense_gemm, "CONFIGS", (Config(128, 64, 64, 4, 8),))  # K is 64
    monkeypatch.setattr(dense_gemm, "MARGIN", float("inf"))
    monkeypatch.setattr(dense_gated_choice, "MARGIN", float("inf"))
    monkeypatch.setattr(dense_gemm, "_choices", {})  # chosen in this test, as forced
    monkeypatch.setattr(dense_gated_choice, "_choices", {})
    prompts = [[(7 * i + 3 * j) % 500 + 1 for j in range(5 + i % 9)] for i in range(40)]
    tokens = {flag: engine_tokens(tiny_llama_dir, "cuda", dense_gated_silu.ENV, flag, prompts,
                                  max_num_seqs=40) for flag in ("0", "1")}
    assert any(c["kernel"] != "unfused" for c in dense_gated_choice.chosen())
    assert tokens["1"] == tokens["0"]
