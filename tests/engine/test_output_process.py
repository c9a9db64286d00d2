"""The output processor in its own process: aborts in each state of a request give what they
give inline; a request whose text cannot be made fails alone; a child that dies is a clear
error, not a hang; shutdown joins the child (the other equivalences with inline are in
test_output_processor.py)."""
import os
import signal

import pytest

from parashift import LLM, SamplingParams
from parashift.engine.detokenizer import rust_backend
from parashift.engine.output_process import OutputProcess
from tests.engine.conftest import tiny_llm
from tests.helpers.failing_decoder import FAILING_TOKEN, FailingDecoder

pytestmark = pytest.mark.usefixtures("single_torch_thread")


@pytest.fixture(scope="module")
def smollm2_process():
    llm = LLM(device="cpu", dtype="float32", output_processor="process")
    yield llm
    llm.shutdown()


def run_aborts(llm: LLM) -> dict[str, list]:
    """Requests aborted while waiting, while running, while final-only, after a stop string
    ended them, and one aborted and added again under its id; each one's outputs, as
    (token count, finish reason), in the order they came."""
    engine = llm.llm_engine
    prompt = engine.tokenizer.encode("Once upon a time")
    long = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    seen: dict[str, list] = {}

    def step():
        for output in engine.step():
            seen.setdefault(output.request_id, []).append(
                (len(output.outputs[0].token_ids), output.outputs[0].finish_reason))

    engine.add_request("waiting", prompt, long)
    engine.abort_request("waiting")
    engine.add_request("running", prompt, long)
    engine.add_request("final", prompt, long.final_only())
    engine.add_request("stopped", prompt, SamplingParams(temperature=0, max_tokens=12,
                                                         ignore_eos=True, stop=[" "]))
    engine.add_request("kept", prompt, SamplingParams(temperature=0, max_tokens=6,
                                                      ignore_eos=True))
    for _ in range(4):
        step()
    for request_id in ("running", "final", "stopped"):
        engine.abort_request(request_id)
    engine.add_request("running", prompt, SamplingParams(temperature=0, max_tokens=3,
                                                         ignore_eos=True))
    while engine.has_unfinished_requests():
        step()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return seen


def test_aborts_in_each_state_as_inline(smollm2, smollm2_process):
    inline, process = run_aborts(smollm2), run_aborts(smollm2_process)
    for seen in (inline, process):
        assert "waiting" not in seen and "final" not in seen
        assert seen["running"][-3:] == [(1, None), (2, None), (3, "length")]
        assert seen["kept"][-1] == (6, "length")
        # its stop string was found by step 4 (its last output came) or its output was on
        # its way at the abort (dropped)
        assert seen.get("stopped", [(0, "stop")])[-1][1] == "stop"
        assert all(n <= 4 for n, _ in seen["running"][:-3])  # the first one's, before its abort
    # the process's outputs may come later: fewer may have come before an abort
    assert process["kept"] == inline["kept"] and process["running"][-3:] == inline["running"][-3:]


def test_a_request_whose_text_cannot_be_made_fails_alone(smollm2_process):
    llm = smollm2_process
    engine = llm.llm_engine
    processor = engine.output_processor
    engine.output_processor = OutputProcess(FailingDecoder(rust_backend(engine.tokenizer)))
    try:
        hello = engine.tokenizer.encode("Hello")
        params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        outs = llm.generate([hello, hello + [FAILING_TOKEN], hello], params)
    finally:
        engine.output_processor.close()
        engine.output_processor = processor
    assert outs[1].finished and outs[1].outputs[0].finish_reason == "error"
    assert "ValueError: boom" in outs[1].error
    assert [len(o.outputs[0].token_ids) for o in (outs[0], outs[2])] == [4, 4]
    assert outs[0].outputs[0].text == outs[2].outputs[0].text != ""
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_a_child_that_dies_is_a_clear_error(tiny_llama_dir):
    llm = tiny_llm(tiny_llama_dir, output_processor="process")
    engine = llm.llm_engine
    child = engine.output_processor._process
    engine.add_request("r", [1, 2, 3], SamplingParams(temperature=0, max_tokens=50,
                                                      ignore_eos=True))
    engine.step()
    assert_a_killed_process_is_a_clear_error(engine, child.pid)
    llm.shutdown()


def assert_a_killed_process_is_a_clear_error(engine, pid: int) -> None:
    """Kills the engine's helper process `pid`: the engine's next steps raise an error that
    names its exit code (no hang), and it stays broken."""
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=r"process died \(exit code -9\)"):
        while engine.has_unfinished_requests():
            engine.step()
    with pytest.raises(RuntimeError, match="process died"):
        engine.step()


def test_shutdown_joins_the_child_and_later_use_is_an_error(tiny_llama_dir):
    llm = tiny_llm(tiny_llama_dir, output_processor="process")
    engine = llm.llm_engine
    child = engine.output_processor._process
    outs = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=4))
    assert len(outs[0].outputs[0].token_ids) == 4
    engine.shutdown()
    assert child.returncode == 0
    with pytest.raises(RuntimeError, match="closed"):
        engine.output_processor.submit(None)
