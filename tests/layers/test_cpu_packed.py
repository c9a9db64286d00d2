"""CPU GEMMs on weights packed once (parashift/layers/cpu_packed.py): the same products as
F.linear, the plain GEMM for any other or changed weight, and a one-device CPU engine's
layers packed (not in deterministic mode) with its greedy tokens unchanged."""
import pytest
import torch
import torch.nn.functional as F

from parashift import SamplingParams
from parashift.layers import cpu_packed
from parashift.layers.cpu_gemm_choice import ENV, onednn_packs
from parashift.layers.cpu_packed import PackedLinear, pack_cpu_weights, unpack_cpu_weights
from tests.engine.conftest import save_tiny_llama, tiny_llm

pytestmark = [pytest.mark.usefixtures("single_torch_thread"),
              pytest.mark.skipif(not cpu_packed.can_pack(), reason="torch built without oneDNN")]


def calls_of(fallback_calls: list):
    def fallback(x, weight, bias):
        fallback_calls.append(weight)
        return F.linear(x, weight, bias)
    return fallback


NO_BF16_PACKING = pytest.mark.skipif(not onednn_packs(torch.bfloat16),
                                     reason="oneDNN packs no bf16 on this CPU (AVX2)")


@pytest.mark.parametrize("dtype", [torch.float32,
                                   pytest.param(torch.bfloat16, marks=NO_BF16_PACKING)])
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_packed_products_match_f_linear(dtype, rows):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 48, generator=gen).to(dtype)
    bias = torch.randn(96, generator=gen).to(dtype)
    x = torch.randn(2, rows, 48, generator=gen).to(dtype)
    fallback_calls = []
    packed = PackedLinear(weight, calls_of(fallback_calls))
    for b in (None, bias):
        ours, theirs = packed(x, weight, b), F.linear(x.double(), weight.double(),
                                                      None if b is None else b.double())
        assert ours.shape == (2, rows, 96) and ours.dtype == dtype
        tolerance = 1e-4 if dtype == torch.float32 else 5e-2
        torch.testing.assert_close(ours.double(), theirs, atol=tolerance, rtol=tolerance)
    assert fallback_calls == []


def test_other_or_changed_weights_take_the_plain_gemm():
    weight = torch.randn(32, 16)
    fallback_calls = []
    packed = PackedLinear(weight, calls_of(fallback_calls))
    x = torch.randn(3, 16)
    other = weight.clone()
    torch.testing.assert_close(packed(x, other, None), F.linear(x, other))
    assert fallback_calls == [other]
    weight.mul_(2)  # written in place after packing: the packed copy is stale
    torch.testing.assert_close(packed(x, weight, None), F.linear(x, weight))
    assert len(fallback_calls) == 2
    assert packed(x.double(), weight.double(), None).dtype == torch.float64  # not its dtype


def test_packing_is_refused_where_it_does_not_fit(monkeypatch):
    monkeypatch.setenv(ENV, "onednn")  # one packed copy the size of the weight
    layer = torch.nn.Linear(64, 64)
    layer.matmul = F.linear
    monkeypatch.setattr(cpu_packed, "mem_available_bytes", lambda: 2 * layer.weight.nbytes - 1)
    assert pack_cpu_weights(layer).nbytes == 0 and layer.matmul is F.linear
    monkeypatch.setattr(cpu_packed, "mem_available_bytes", lambda: 2 * layer.weight.nbytes)
    assert pack_cpu_weights(layer).nbytes == layer.weight.nbytes
    assert isinstance(layer.matmul, PackedLinear)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama_packed"))


def packed_layers(llm) -> list:
    model = llm.llm_engine.runner.model
    return [m for m in model.modules() if isinstance(getattr(m, "matmul", None), PackedLinear)]


def test_an_engine_packs_its_layers_and_keeps_its_tokens(model_dir, monkeypatch):
    monkeypatch.setenv(ENV, "onednn")  # every GEMM packed (the timed choice: test_cpu_gemm_choice)
    llm = tiny_llm(model_dir, enable_prefix_caching=False)
    layers = packed_layers(llm)
    # 2 layers x (qkv, o, gate_up, down) and the LM head
    assert len(layers) == 9
    assert llm.llm_engine.runner.packed_weight_bytes == sum(m.weight.nbytes for m in layers)
    prompts = [[5, 17, 300, 42, 7], [9, 8, 7, 6, 5, 4, 3, 2, 1, 11, 12]]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    packed = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert unpack_cpu_weights(llm.llm_engine.runner.model) == 9 and packed_layers(llm) == []
    plain = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert packed == plain


def test_deterministic_mode_keeps_its_invariant_gemms(model_dir):
    llm = tiny_llm(model_dir, deterministic=True)
    assert packed_layers(llm) == [] and llm.llm_engine.runner.packed_weight_bytes == 0
    assert llm.llm_engine.runner.cpu_gemm.source.startswith("plain")
