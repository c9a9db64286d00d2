"""`LLM.shutdown()`, `with LLM(...) as llm:` and `del llm` stop the worker processes
and release the model (issue 18), so a second `LLM` starts in the same process:
here with two gloo ranks (tensor parallel) on the CPU."""
import multiprocessing
import weakref

import pytest

from parashift import LLM, SamplingParams
from tests.engine.conftest import save_tiny_llama

PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
PROMPTS = [[1, 2, 3, 4], [5, 6, 7]]
OPTIONS = dict(device="cpu", dtype="float32", skip_tokenizer_init=True, num_blocks=64)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))


def tp2(model_dir) -> LLM:
    return LLM(model_dir, tensor_parallel_size=2, **OPTIONS)


def workers_of(llm: LLM) -> list:
    procs = list(llm.llm_engine.executor.procs)
    assert len(procs) == 2 and all(p.is_alive() for p in procs)
    return procs


def assert_gone(procs) -> None:
    assert not any(p.is_alive() for p in procs), [p.exitcode for p in procs]
    names = [p.name for p in multiprocessing.active_children()]
    assert not any(name.startswith("parashift-worker") for name in names), names


def token_ids(outputs) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in outputs]


def test_shutdown_then_a_second_llm_starts(model_dir):
    llm = tp2(model_dir)
    procs = workers_of(llm)
    first = token_ids(llm.generate(PROMPTS, PARAMS))
    llm.shutdown()
    assert_gone(procs)
    assert llm.is_shut_down
    llm.shutdown()  # idempotent
    with pytest.raises(RuntimeError, match="shut down"):
        llm.generate(PROMPTS, PARAMS)

    with tp2(model_dir) as second:  # the context manager
        procs = workers_of(second)
        assert token_ids(second.generate(PROMPTS, PARAMS)) == first
    assert_gone(procs) and second.is_shut_down


def test_del_stops_the_workers(model_dir):
    llm = tp2(model_dir)
    procs = workers_of(llm)
    llm.generate(PROMPTS, PARAMS)
    del llm  # no gc.collect(): the last reference going is enough
    assert_gone(procs)


def test_shutdown_releases_the_model_of_one_device(model_dir):
    """One rank runs in this process: shutdown must drop the model and KV cache
    (on a GPU, its memory) even while the LLM object itself is kept."""
    llm = LLM(model_dir, **OPTIONS)
    runner = weakref.ref(llm.llm_engine.executor.runner)
    llm.generate(PROMPTS, PARAMS)
    llm.shutdown()
    assert runner() is None
