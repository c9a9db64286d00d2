"""The engine core in a process of its own (core_process.py) behind its client
(core_client.py): aborts in each state give what they give in one process; bad requests
fail alone; the engine's other attributes are asked of the core; a core that dies is a
clear error, not a hang; shutdown stops it; the server's asyncio front streams through it
(the outputs' equivalence with the other output processors: test_output_processor.py)."""
import asyncio
import gc
import os

import pytest

from parashift import LLM, SamplingParams
from parashift.config import EngineConfig
from parashift.engine.async_engine import AsyncLLMEngine
from parashift.engine.core_client import CoreOutputs, EngineCoreClient, wants_core_process
from parashift.gc_tuning import GC_THRESHOLDS
from tests.engine.conftest import tiny_llm
from tests.engine.test_output_process import assert_a_killed_process_is_a_clear_error, run_aborts

pytestmark = pytest.mark.usefixtures("single_torch_thread")

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_core(tiny_llama_dir):
    llm = tiny_llm(tiny_llama_dir, engine_core_process=True)
    yield llm
    llm.shutdown()


def test_the_core_runs_in_another_process(tiny_core):
    engine = tiny_core.llm_engine
    assert isinstance(engine, EngineCoreClient) and engine.core_pid != os.getpid()
    assert engine._process.poll() is None


def test_aborts_in_each_state_as_in_one_process(smollm2):
    core = LLM(device="cpu", dtype="float32", engine_core_process=True)
    try:
        inline, split = run_aborts(smollm2), run_aborts(core)
    finally:
        core.shutdown()
    assert "waiting" not in split and "final" not in split
    assert split["running"][-3:] == inline["running"][-3:] == [(1, None), (2, None),
                                                                (3, "length")]
    assert split["kept"] == inline["kept"]
    assert split.get("stopped", [(0, "stop")])[-1][1] == "stop"


def test_bad_requests_fail_alone(tiny_core, tiny_llama_dir):
    engine = tiny_core.llm_engine
    errors = engine.add_requests([("good", [1, 2, 3], GREEDY, 0),
                                  ("vocab", [1, 10**6], GREEDY, 0),
                                  ("params", [1, 2], {"temperature": 0}, 0),
                                  ("also", [4, 5], GREEDY, 0)])
    assert errors[0] is None and errors[3] is None
    assert isinstance(errors[1], ValueError) and "out of vocabulary" in str(errors[1])
    assert isinstance(errors[2], ValueError) and "SamplingParams" in str(errors[2])
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("good", [1], GREEDY)
    finished = {}
    while engine.has_unfinished_requests():
        finished.update((o.request_id, o) for o in engine.step() if o.finished)
    assert sorted(finished) == ["also", "good"]
    expected = tiny_llm(tiny_llama_dir).generate([[1, 2, 3]], GREEDY)[0].outputs[0].token_ids
    assert finished["good"].outputs[0].token_ids == expected


def test_a_bad_prompt_in_generate_leaves_no_request_behind(tiny_core):
    with pytest.raises(ValueError, match="out of vocabulary"):
        tiny_core.generate([[1, 2], [10**6], [3, 4]], GREEDY)
    engine = tiny_core.llm_engine
    assert not engine.has_unfinished_requests()
    assert engine.scheduler.num_waiting == engine.scheduler.num_running == 0  # (asked of it)
    assert len(tiny_core.generate([[1, 2]], GREEDY)[0].outputs[0].token_ids) == 6


def test_the_engines_other_attributes_are_asked_of_the_core(tiny_core):
    engine = tiny_core.llm_engine
    assert engine.layout_info() == engine._call("layout_info")
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert engine.stats().num_running == 0 and engine.max_model_len > 0
    with pytest.raises(AttributeError, match="no_such_attribute"):
        engine.no_such_attribute
    with pytest.raises(ValueError):  # the core's error, raised here; the core goes on
        engine.set_layout(3)
    assert len(tiny_core.generate([[7]], GREEDY)[0].outputs[0].token_ids) == 6


def test_a_core_that_dies_is_a_clear_error(tiny_llama_dir):
    llm = tiny_llm(tiny_llama_dir, engine_core_process=True)
    engine = llm.llm_engine
    engine.add_request("r", [1, 2, 3], SamplingParams(temperature=0, max_tokens=400,
                                                      ignore_eos=True))
    engine.step()
    assert_a_killed_process_is_a_clear_error(engine, engine.core_pid)
    llm.shutdown()


def test_shutdown_stops_the_core_and_later_use_is_an_error(tiny_llama_dir):
    """Also: an output per request and step is made here, so this process's collector runs
    as rarely as in the engine's process (gc_tuning.py) while the core runs, and as before
    once it has stopped (one core started for both: a start is seconds on a CPU)."""
    outer = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        llm = tiny_llm(tiny_llama_dir, engine_core_process=True)
        assert gc.get_threshold() == GC_THRESHOLDS
        engine = llm.llm_engine
        engine.add_request("running", [1, 2], SamplingParams(max_tokens=300, ignore_eos=True))
        engine.step()
        llm.shutdown()
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*outer)
    assert engine._process.returncode == 0
    with pytest.raises(RuntimeError, match="shut down"):
        engine.add_request("late", [1], GREEDY)


def test_the_asyncio_front_streams_through_the_core(tiny_core, tiny_llama_dir):
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, output_kind="delta")
    expected = tiny_llm(tiny_llama_dir).generate([[5, 6, 7]], params)[0].outputs[0].token_ids

    async def main():
        front = AsyncLLMEngine(tiny_core.llm_engine)
        front.start()
        tokens = []
        with pytest.raises(ValueError, match="out of vocabulary"):
            await front.add_request("bad", [10**6], params)
        async for output in front.generate("a", [5, 6, 7], params):
            tokens += output.outputs[0].token_ids
        await front.shutdown()
        return tokens
    assert asyncio.run(asyncio.wait_for(main(), timeout=60)) == expected


def test_outputs_of_aborted_requests_are_not_made():
    sent = []
    outputs = CoreOutputs(None, sent.append)
    outputs.added("a", GREEDY, 0)
    outputs.added("b", GREEDY, 0)
    new = [("new", rid, None, [1, 2], GREEDY, True) for rid in ("a", "b")]
    assert outputs.make(new) == []
    outputs.forget("a")
    made = outputs.make([("step", ["a", "b"], [3, 4], None, {"b": ("length", None)},
                          {"a": (1.0, 0), "b": (2.0, 1)})])
    assert [(o.request_id, o.outputs[0].token_ids, o.finished) for o in made] == [
        ("b", [4], True)]
    assert made[0].metrics == {"first_token_time": 2.0} and made[0].num_cached_tokens == 1
    assert outputs.owed == set() and sent == []


@pytest.mark.parametrize("option, offline, device, cores, options, wanted", [
    (None, False, "cuda", 16, {}, True),  # the server on a GPU host
    (None, True, "cuda", 16, {}, False),  # the offline LLM
    (None, False, "cpu", 16, {}, False),
    (None, False, "cuda", 2, {}, False),
    (None, False, "cuda", 16, {"output_processor": "process"}, False),
    (None, False, "cuda", 16, {"nnodes": 2, "data_parallel_size": 2}, False),
    (True, True, "cpu", 1, {}, True),
    (False, False, "cuda", 16, {}, False),
])
def test_auto_puts_the_servers_core_in_its_own_process_on_gpu_hosts(option, offline, device,
                                                                     cores, options, wanted):
    config = EngineConfig(model="m", engine_core_process=option, **options)
    assert wants_core_process(config, offline, device, cores) is wanted


def test_engine_core_process_is_checked():
    with pytest.raises(ValueError, match="engine_core_process must be true, false or None"):
        EngineConfig(model="m", engine_core_process="yes")
    with pytest.raises(ValueError, match="does not apply"):
        EngineConfig(model="m", engine_core_process=True, output_processor="process")


def test_a_core_that_cannot_start_raises_its_error_here(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LLM(model=str(tmp_path / "missing"), device="cpu", engine_core_process=True)
