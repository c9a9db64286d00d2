"""FP8 quality on real weights: the embedded SmolLM2-135M's perplexity over a fixed English
text (quality_text.txt) with FP8 weights, and with FP8 weights + FP8 KV, against bf16
(benchmarks/fp8_quality.py measures it with greedy agreement beside)."""
import pytest

from tests.bench.benchmark_scripts import load_benchmark
from tests.conftest import requires_smollm2

pytestmark = [requires_smollm2, pytest.mark.usefixtures("single_torch_thread")]
# The CPU rounds the weights only (the GPU's FP8 GEMM rounds activations too); SmolLM2's
# weights come from a Q4_1 GGUF, re-rounded to E4M3 per channel. Measured on this text
# (1,267 tokens; bf16 18.33): FP8 weights 1.018x, FP8 weights + FP8 KV (scales 1.0) 1.027x.
# Issue 60 asks for 3%: the bounds are the measured figures plus a small margin. (On the
# text's first 289 tokens alone, equally good roundings scattered 1.004x-1.044x: too
# short a text to tell 3%; docs/quantization.md.)
BOUNDS = {"fp8 weights": 1.025, "fp8 weights + fp8 KV": 1.03}


@pytest.fixture(scope="module")
def quality():
    return load_benchmark("fp8_quality")


@pytest.fixture(scope="module")
def bf16_perplexity(quality):
    return perplexity_of(quality, {})


def perplexity_of(quality, options) -> float:
    llm = quality.load(**options)
    try:
        return quality.perplexity(llm, quality.TEXT.read_text())
    finally:
        llm.llm_engine.shutdown()


@pytest.mark.parametrize("name", list(BOUNDS))
def test_fp8_perplexity_within_bound_of_bf16(quality, bf16_perplexity, name):
    assert 5 < bf16_perplexity < 100  # the model reads the text as English
    ratio = perplexity_of(quality, quality.CONFIGS[name]) / bf16_perplexity
    assert ratio < BOUNDS[name], f"{name}: perplexity {ratio:.4f}x bf16's"
