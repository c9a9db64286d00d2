"""FP8 quality on real weights: the embedded SmolLM2-135M's perplexity over a fixed English
text (quality_text.txt) with FP8 weights, and with FP8 weights + FP8 KV, against the model
unquantized, all computed in float32 (benchmarks/fp8_quality.py measures it against bf16 with
greedy agreement beside)."""
import pytest

from tests.bench.benchmark_scripts import load_benchmark
from tests.conftest import requires_smollm2

pytestmark = [requires_smollm2, pytest.mark.usefixtures("single_torch_thread")]
# The CPU rounds the weights only (the GPU's FP8 GEMM rounds activations too); SmolLM2's
# weights come from a Q4_1 GGUF, re-rounded to E4M3 per channel. The test computes in float32
# against float32 (benchmarks/fp8_quality.py measures against bf16, issue 60's reference): on
# a CPU without AVX-512 a bf16 matmul runs ~8x slower than fp32's (the three passes: ~140 s
# of CPU against ~40 s), and against float32 the ratios come out 0.3-0.4% lower than against
# bf16. Measured on this text (1,267 tokens; float32 18.363): FP8 weights 1.0139x,
# FP8 weights + FP8 KV (scales 1.0) 1.0236x; the bounds are those plus the margins the bf16
# bounds had over their figures (1.018x, 1.027x: +0.007, +0.003). (On the text's first 289
# tokens alone, equally good roundings scattered 1.004x-1.044x: too short a text to tell 3%.)
BOUNDS = {"fp8 weights": 1.021, "fp8 weights + fp8 KV": 1.027}
COMPUTE = {"dtype": "float32"}


@pytest.fixture(scope="module")
def quality():
    return load_benchmark("fp8_quality")


@pytest.fixture(scope="module")
def float32_perplexity(quality):
    return perplexity_of(quality, {})


def perplexity_of(quality, options) -> float:
    llm = quality.load(**{**options, **COMPUTE})
    try:
        return quality.perplexity(llm, quality.TEXT.read_text())
    finally:
        llm.llm_engine.shutdown()


@pytest.mark.parametrize("name", list(BOUNDS))
def test_fp8_perplexity_within_bound_of_float32(quality, float32_perplexity, name):
    assert 5 < float32_perplexity < 100  # the model reads the text as English
    ratio = perplexity_of(quality, quality.CONFIGS[name]) / float32_perplexity
    assert ratio < BOUNDS[name], f"{name}: perplexity {ratio:.4f}x float32's"
