"""The multi-process executor fails fast and leaves no processes behind."""
import os
import signal
import time

import pytest

from parashift import LLM, SamplingParams
from parashift.executor.multiproc import WorkerFailure


@pytest.fixture
def tp2(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, device="cpu", dtype="float32", skip_tokenizer_init=True,
              num_blocks=64, tensor_parallel_size=2, worker_timeout_s=120)
    yield llm
    llm.llm_engine.shutdown()


def test_a_dead_worker_fails_the_engine_and_no_process_is_left(tp2):
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    assert len(tp2.generate([[1, 2, 3]], params)[0].outputs[0].token_ids) == 4
    procs = list(tp2.llm_engine.executor.procs)
    os.kill(procs[1].pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerFailure, match="rank 1"):
        tp2.generate([[1, 2, 3]], params)
    assert time.monotonic() - start < 30
    for proc in procs:
        proc.join(timeout=10)
        assert not proc.is_alive()


def test_a_hung_worker_fails_the_engine_after_the_timeout(tp2):
    procs = list(tp2.llm_engine.executor.procs)
    tp2.llm_engine.executor.timeout_s = 10  # start-up was allowed longer on a busy machine
    os.kill(procs[1].pid, signal.SIGSTOP)  # alive but never answers
    try:
        with pytest.raises(WorkerFailure, match="did not finish within 10 s"):
            tp2.generate([[1, 2, 3]], SamplingParams(max_tokens=2))
    finally:
        try:
            os.kill(procs[1].pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    for proc in procs:
        proc.join(timeout=10)
        assert not proc.is_alive()


def test_a_worker_that_cannot_start_names_its_error(tiny_llama_dir, tmp_path):
    import shutil
    broken = tmp_path / "broken"
    shutil.copytree(tiny_llama_dir, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(WorkerFailure, match="failed to start(.|\n)*model.safetensors"):
        LLM(str(broken), device="cpu", skip_tokenizer_init=True, tensor_parallel_size=2)


def test_two_engines_run_side_by_side_on_one_host(tiny_llama_dir, tp2):
    other = LLM(tiny_llama_dir, device="cpu", dtype="float32", skip_tokenizer_init=True,
                num_blocks=64, sequence_parallel_size=2)
    try:
        params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
        first = tp2.generate([[7, 8, 9]], params)[0].outputs[0].token_ids
        second = other.generate([[7, 8, 9]], params)[0].outputs[0].token_ids
        assert first == second and len(first) == 6
    finally:
        other.llm_engine.shutdown()
