"""benchmarks/step_ceiling.py maps an engine step's kernels, in launch order, to the bytes
each operation must read: each layer's four projections and then the LM head to the GEMM
kernels, the layer's K and V share to the KV-reading kernels, a row a sequence to the rest;
a step whose kernels do not match the model's weights is an error."""
import pytest

from parashift import LLM
from tests.bench.benchmark_scripts import load_benchmark
from tests.helpers.tiny_configs import tiny_config

# one layer of the 8B's FP8 one-row graph (session 46), as the profiler names its kernels
LAYER = ("_rms_norm_kernel", "_fp8_gemv_kernel", "preloaded_decode_kernel",
         "reduce_splits_kernel", "_fp8_gemv_kernel", "_rms_norm_kernel", "_l2_prefetch_kernel",
         "_fp8_gemv_kernel", "_silu_and_mul_kernel", "_fp8_gemv_kernel")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    config = tiny_config("llama-gqa-untied")
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(path)
    return LLM(model=str(path / "config.json"), dtype="float32", device="cpu",
               skip_tokenizer_init=True, max_model_len=64).llm_engine.runner.model


def step(layers: int, head: str = "nvjet_tst_64x8_64x16_2x1_v_bz_TNT") -> list[dict]:
    names = ["void at::native::indexSelectSmallIndex", *LAYER * layers, "_rms_norm_kernel",
             head, "_argmax_kernel"]
    return [dict(name=n, us=1.0) for n in names]


def test_each_kernel_reads_its_operations_bytes(model):
    bench = load_benchmark("step_ceiling")
    layers = model.model.layers
    kv_per_layer = 2 * bench.KV_ROW_BYTES
    ops = bench.step_operations(step(len(layers)), model, kv_per_layer)
    kinds = [op["kind"] for op in ops]
    assert kinds[1:1 + len(LAYER)] == ["small", "qkv", "kv", "small", "o", "small", "small",
                                       "gate_up", "small", "down"]
    assert kinds[-3:] == ["small", "lm_head", "small"]
    weights = [op["bytes"] for op in ops if op["kind"] in ("qkv", "lm_head")]
    first = layers[0].self_attn.qkv_proj.weight
    assert weights[0].data_ptr() == first.data_ptr()
    assert weights[0].numel() == first.numel() * first.element_size()
    assert weights[-1].data_ptr() == model.lm_head.weight.data_ptr()
    kv = [op["bytes"] for op in ops if op["kind"] == "kv"]
    assert len(kv) == len(layers) and all(t.numel() == kv_per_layer for t in kv)
    assert kv[1].data_ptr() == layers[1].self_attn.attn.k_cache.data_ptr()


@pytest.mark.parametrize("name, kind", [
    ("_gated_tma_kernel", "gemm"),  # FP8 gate_up with SiLU·mul in its epilogue (64 rows)
    ("_fp8_tma_kernel", "gemm"), ("decode_attention_kernel", "kv"),
    ("_quantize_rows_kernel", "small"), ("_rotary_kernel", "small")])
def test_each_kernel_of_a_64_row_fp8_step_has_its_kind(name, kind):
    assert load_benchmark("step_ceiling").kind_of(name) == kind


def test_a_step_that_does_not_match_the_weights_is_an_error(model):
    bench = load_benchmark("step_ceiling")
    kernels = step(len(model.model.layers))
    with pytest.raises(ValueError, match="GEMM kernels"):
        bench.step_operations(kernels[:-2] + kernels[-1:], model, bench.KV_ROW_BYTES)
