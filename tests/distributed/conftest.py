import pytest

from parashift import LLM, SamplingParams
from tests.distributed.test_plans import COMMON
from tests.engine.conftest import tiny_llama_dir  # noqa: F401  (shared fixture)

# Greedy continuations of the embedded SmolLM2 that launches across "hosts" must reproduce.
PROMPTS = ["The capital of France is", "Three primary colors are"]
MAX_TOKENS = 16


@pytest.fixture(scope="session")
def smollm2_reference() -> list[str]:
    """One device's greedy texts of PROMPTS (no generation-config defaults)."""
    llm = LLM(device="cpu", dtype="float32", generation_config="vllm")
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    llm.llm_engine.shutdown()
    return [out.outputs[0].text for out in outputs]


@pytest.fixture(scope="module")
def one_device(model):
    """The module's single-device engine for its references (`model`: the module's model
    directory and its reference), shared by its tests: without prefix caching, each
    generate computes what a fresh engine's would."""
    llm = LLM(model[0], **{**COMMON, "enable_prefix_caching": False})
    yield llm
    llm.llm_engine.shutdown()
