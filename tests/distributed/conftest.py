import pytest

from parashift import LLM
from tests.distributed.test_plans import COMMON
from tests.engine.conftest import tiny_llama_dir  # noqa: F401  (shared fixture)


@pytest.fixture(scope="module")
def one_device(model):
    """The module's single-device engine for its references (`model`: the module's model
    directory and its reference), shared by its tests: without prefix caching, each
    generate computes what a fresh engine's would."""
    llm = LLM(model[0], **{**COMMON, "enable_prefix_caching": False})
    yield llm
    llm.llm_engine.shutdown()
