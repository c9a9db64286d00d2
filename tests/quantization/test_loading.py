"""FP8 checkpoints end to end on one device: a compressed-tensors checkpoint the test writes
(E4M3 weights, per-channel or per-tensor scales, config.json's quantization_config) loads
as it is; a bf16 checkpoint quantized at load runs the function of its E4M3 rows; FP8 KV
pages hold twice the tokens and give the same tokens under chunked prefill, prefix caching
and swap; bad checkpoints are clear errors."""
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from parashift import LLM, SamplingParams
from parashift.layers.fused_moe import FusedExperts
from parashift.quantization.fp8 import FP8, dequantize, quantize_rows
from tests.engine.conftest import tiny_llama_dir, tiny_llm  # noqa: F401  (shared fixture)
from tests.engine.test_llm_engine import GREEDY, random_prompts, token_ids
from tests.helpers.tiny_configs import save_tiny_checkpoint

FP8_CT = {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
          "config_groups": {"group_0": {"targets": ["Linear"],
                                        "weights": {"num_bits": 8, "type": "float",
                                                    "strategy": "channel"},
                                        "input_activations": {"num_bits": 8, "type": "float",
                                                              "strategy": "token",
                                                              "dynamic": True}}}}


def is_linear(name: str) -> bool:
    return name.endswith("proj.weight")


def write_checkpoint(src: str, dst: Path, per_tensor=False, qdq=False, drop=None,
                     qconfig=FP8_CT, kv_scales=None) -> str:
    """`src`'s checkpoint with its linear weights in E4M3 and their scales (compressed-
    tensors), or dequantized back to float (`qdq`: the dense model FP8 runs)."""
    dst.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, w in load_file(f"{src}/model.safetensors").items():
        if not is_linear(name):
            tensors[name] = w
            continue
        if per_tensor:
            scale = w.float().abs().max().reshape(()) / torch.finfo(FP8).max
            q = (w.float() / scale).to(FP8)
        else:
            q, scale = quantize_rows(w)
        if qdq:
            tensors[name] = dequantize(q, scale, w.dtype)
            continue
        tensors[name], tensors[name + "_scale"] = q, scale
    for name, value in (kv_scales or {}).items():
        tensors[name] = torch.tensor(value)
    for name in drop or ():
        del tensors[name]
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads(Path(src, "config.json").read_text())
    if not qdq:
        config["quantization_config"] = qconfig
    (dst / "config.json").write_text(json.dumps(config))
    return str(dst)


@pytest.fixture(scope="module")
def checkpoints(tiny_llama_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8")
    return {"channel": write_checkpoint(tiny_llama_dir, root / "channel"),
            "tensor": write_checkpoint(tiny_llama_dir, root / "tensor", per_tensor=True),
            "qdq": write_checkpoint(tiny_llama_dir, root / "qdq", qdq=True),
            "qdq_tensor": write_checkpoint(tiny_llama_dir, root / "qdq_t", qdq=True,
                                           per_tensor=True)}


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(6)


def generate(model_dir, prompt_list, **options):
    llm = tiny_llm(model_dir, **options)
    try:
        return token_ids(llm.generate(prompt_list, GREEDY)), llm.llm_engine.runner.model
    finally:
        llm.llm_engine.shutdown()


def linear_weights(model):
    return [m.weight for m in model.modules() if hasattr(m, "weight_scale")]


def test_quantized_at_load_runs_its_e4m3_rows(tiny_llama_dir, checkpoints, prompts):
    expected, _ = generate(checkpoints["qdq"], prompts)
    tokens, model = generate(tiny_llama_dir, prompts, quantization="fp8")
    assert tokens == expected
    weights = linear_weights(model)
    assert len(weights) == 8 and all(w.dtype == torch.float8_e4m3fn for w in weights)
    assert model.lm_head.weight.dtype == model.model.embed_tokens.weight.dtype == torch.float32


@pytest.mark.parametrize("scales, dense", [("channel", "qdq"), ("tensor", "qdq_tensor")])
def test_compressed_tensors_checkpoint_loads_as_it_is(checkpoints, prompts, scales, dense):
    expected, _ = generate(checkpoints[dense], prompts)
    tokens, model = generate(checkpoints[scales], prompts)  # detected: no flag
    assert tokens == expected
    assert all(w.dtype == torch.float8_e4m3fn for w in linear_weights(model))


def test_fp8_kv_holds_twice_the_tokens_and_survives_chunks_caching_and_swap(
        tiny_llama_dir, prompts):
    shared = [prompts[0] + p for p in prompts]  # a common prefix for the cache to hit
    ample = dict(kv_cache_dtype="fp8", max_num_batched_tokens=4096, enable_prefix_caching=False)
    expected, _ = generate(tiny_llama_dir, shared, **ample)
    memory = dict(num_blocks=None, kv_cache_memory=1 << 17, max_model_len=128)
    llm = tiny_llm(tiny_llama_dir, **memory)
    dense_blocks = llm.llm_engine.runner.kv.num_blocks
    llm.llm_engine.shutdown()
    llm = tiny_llm(tiny_llama_dir, kv_cache_dtype="fp8", **memory)
    try:
        assert llm.llm_engine.runner.kv.k.dtype == torch.float8_e4m3fn
        assert llm.llm_engine.runner.kv.num_blocks == 4 * dense_blocks  # float32 -> 1 byte
    finally:
        llm.llm_engine.shutdown()
    tight = dict(kv_cache_dtype="fp8", max_num_batched_tokens=24, num_blocks=24,
                 max_model_len=384, preemption_mode="swap", swap_space=0.01)
    llm = tiny_llm(tiny_llama_dir, **tight)
    try:
        assert token_ids(llm.generate(shared, GREEDY)) == expected
        stats = llm.llm_engine.stats()
        assert stats.num_swapped_out > 0
    finally:
        llm.llm_engine.shutdown()


def test_checkpoint_kv_scales_are_read(tiny_llama_dir, tmp_path, prompts):
    scales = {f"model.layers.{i}.self_attn.{kv}_scale": 0.5 for i in range(2) for kv in "kv"}
    path = write_checkpoint(tiny_llama_dir, tmp_path / "kv", kv_scales=scales)
    llm = tiny_llm(path, kv_cache_dtype="fp8")
    try:
        attn = llm.llm_engine.runner.model.model.layers[1].self_attn.attn
        assert attn.kv_scales == [0.5, 0.5]
        assert len(llm.generate(prompts[:1], GREEDY)[0].outputs[0].token_ids) > 0
    finally:
        llm.llm_engine.shutdown()


def test_missing_scales_and_other_schemes_are_clear_errors(tiny_llama_dir, tmp_path):
    name = "model.layers.0.self_attn.q_proj.weight_scale"
    missing = write_checkpoint(tiny_llama_dir, tmp_path / "missing", drop=[name])
    with pytest.raises(ValueError, match="checkpoint lacks scales of part of.*qkv_proj.weight_scale"):
        tiny_llm(missing)
    gptq = write_checkpoint(tiny_llama_dir, tmp_path / "gptq",
                            qconfig={"quant_method": "gptq", "bits": 4})
    with pytest.raises(ValueError, match="quantized with 'gptq'.*not supported"):
        tiny_llm(gptq)
    with pytest.raises(ValueError, match="quantization 'awq' is not supported"):
        LLM(tiny_llama_dir, device="cpu", quantization="awq")
    shutil.copy(Path(tiny_llama_dir, "model.safetensors"), tmp_path / "gptq")  # bf16 weights
    dense = tmp_path / "gptq"
    config = json.loads((dense / "config.json").read_text())
    config["quantization_config"] = FP8_CT
    (dense / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="fp8, but a linear weight is stored as F32"):
        tiny_llm(str(dense))


@pytest.fixture(scope="module")
def moe_checkpoints(tmp_path_factory):
    """A tiny Qwen3-MoE (router kept dense), its FP8 checkpoint and its dense twin."""
    root = tmp_path_factory.mktemp("fp8_moe")
    save_tiny_checkpoint("qwen3-moe", root / "dense")
    return {"dense": str(root / "dense"),
            "fp8": write_checkpoint(str(root / "dense"), root / "fp8"),
            "qdq": write_checkpoint(str(root / "dense"), root / "qdq", qdq=True)}


def test_fp8_experts_quantized_at_load_or_loaded_run_their_e4m3_rows(moe_checkpoints, prompts):
    prompts = prompts[:2]
    expected, _ = generate(moe_checkpoints["qdq"], prompts)
    for directory, options in ((moe_checkpoints["dense"], dict(quantization="fp8")),
                               (moe_checkpoints["fp8"], {})):
        tokens, model = generate(directory, prompts, **options)
        assert tokens == expected
        experts = [m for m in model.modules() if isinstance(m, FusedExperts)]
        assert experts and all(e.gate_up_proj.dtype == e.down_proj.dtype == torch.float8_e4m3fn
                               for e in experts)
        assert experts[0].down_proj_scale.shape[1:] == (64, 1)


def test_random_weights_of_a_shape_are_fp8_rows_with_their_scales():
    """A shape without weights (speed work) in FP8: every linear weight is E4M3, drawn and
    quantized by rows, its scales the rows' (not drawn at random themselves)."""
    shape = Path(__file__).resolve().parents[2] / "benchmarks" / "shapes" / "tiny-llama.json"
    llm = LLM(model=str(shape), dtype="float32", quantization="fp8", skip_tokenizer_init=True,
              num_blocks=32, max_model_len=64)
    params = dict(llm.llm_engine.runner.model.named_parameters())
    fp8 = {name: p for name, p in params.items() if p.dtype == FP8}
    assert fp8 and all(name.endswith("proj.weight") for name in fp8)
    for name, weight in fp8.items():
        scale = params[name.removesuffix("weight") + "weight_scale"]
        assert (scale > 0).all()
        assert weight.float().abs().amax(-1).eq(torch.finfo(FP8).max).all()
    llm.llm_engine.shutdown()


GREEDY_LOGPROBS = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=1)


def kv_scale_tensors(layers: int, k, v) -> dict:
    return {f"model.layers.{i}.self_attn.{name}_scale": value
            for i in range(layers) for name, value in (("k", k), ("v", v))}


def logprobs_and_tokens(model_dir, prompt_list, **options):
    llm = tiny_llm(model_dir, kv_cache_dtype="fp8", **options)
    try:
        outputs = llm.generate(prompt_list, GREEDY_LOGPROBS)
        attn = llm.llm_engine.runner.model.model.layers[1].self_attn.attn
        return outputs, [s.tolist() if isinstance(s, torch.Tensor) else s
                         for s in attn.kv_scales]
    finally:
        llm.llm_engine.shutdown()


def largest_logprob_gap(outputs, reference) -> float:
    """Between the greedy tokens' logprobs, where the tokens are the same."""
    assert token_ids(outputs) == token_ids(reference)
    return max(abs(got[token] - want[token]) for out, ref in zip(outputs, reference)
               for token, got, want in zip(out.outputs[0].token_ids, out.outputs[0].logprobs,
                                           ref.outputs[0].logprobs))


def test_kv_scales_per_head_are_read_and_applied(tiny_llama_dir, checkpoints, tmp_path, prompts):
    """Per KV head ([kv_heads], llm-compressor's attention-head strategy): the pool holds
    k / k_scale and v / v_scale of each head, each query head's q and output are scaled by
    its KV head's. One scale for every head computes what that scale per tensor does; scales
    of powers of two round as scale 1.0 does (but for E4M3's subnormals), so they keep the
    tokens; a query head scaled by another KV head's scale would not."""
    def with_scales(name, k, v):
        return write_checkpoint(tiny_llama_dir, tmp_path / name,
                                kv_scales=kv_scale_tensors(2, k, v))
    base, scales = logprobs_and_tokens(checkpoints["channel"], prompts)
    assert scales == [1.0, 1.0]
    tensor, _ = logprobs_and_tokens(with_scales("tensor", 0.37, 0.37), prompts)
    same, scales = logprobs_and_tokens(with_scales("same", [0.37] * 2, [0.37] * 2), prompts)
    assert scales == [[pytest.approx(0.37)] * 2] * 2
    assert largest_logprob_gap(same, tensor) < 1e-4
    two, scales = logprobs_and_tokens(with_scales("two", [0.5, 2.0], [2.0, 0.25]), prompts)
    assert scales == [[0.5, 2.0], [2.0, 0.25]]
    assert largest_logprob_gap(two, base) < 0.1  # measured 0.026
    with pytest.raises(ValueError, match=r"KV cache scale of shape \(3,\) is neither per tensor "
                                         r"nor per KV head \(2 heads\)"):
        tiny_llm(with_scales("three", [0.5] * 3, 1.0), kv_cache_dtype="fp8")
