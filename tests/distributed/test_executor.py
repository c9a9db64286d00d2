"""The multi-process executor fails fast and leaves no processes behind."""
import contextlib
import os
import signal
import time

import pytest

from parashift import LLM, SamplingParams
from parashift.executor import process_start
from parashift.executor.multiproc import WorkerFailure, _exit_status
from tests.engine.conftest import save_tiny_llama

LONG_PROMPT = 2048


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


def test_a_hung_worker_fails_the_engine_after_the_step_timeout(tp2):
    """A step that never ends while its worker still beats (a collective that hangs)
    fails after worker_step_timeout_s (here the heartbeat is turned off to stand for it)."""
    procs = list(tp2.llm_engine.executor.procs)
    tp2.llm_engine.executor.step_timeout_s = 3
    tp2.llm_engine.executor.heartbeat_timeout_s = float("inf")
    tp2.llm_engine.executor.stopped_timeout_s = float("inf")
    os.kill(procs[1].pid, signal.SIGSTOP)  # alive but never answers
    try:
        with pytest.raises(WorkerFailure, match="did not finish within 3 s"):
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


def test_collective_rpc_runs_a_runner_method_on_every_rank(tp2):
    """Each TP rank answers with its own shard's checksum; an unknown method is refused in
    the engine process and the workers keep serving."""
    executor = tp2.llm_engine.executor
    sums = executor.collective_rpc("weights_checksum")
    assert len(sums) == 2 and sums[0] != sums[1]  # different shards
    with pytest.raises(ValueError, match="no method 'nope'"):
        executor.collective_rpc("nope")
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    assert len(tp2.generate([[1, 2, 3]], params)[0].outputs[0].token_ids) == 3
    assert executor.collective_rpc("weights_checksum") == sums


def wait_for_failure(engine, timeout: float) -> tuple[str, float]:
    """Calls check_health() until it raises; its message and the seconds it took."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            engine.check_health()
        except WorkerFailure as exc:
            return str(exc), time.monotonic() - start
        time.sleep(0.1)
    raise AssertionError(f"check_health() saw nothing wrong for {timeout} s")


@contextlib.contextmanager
def stopped(proc):
    """The worker process stopped (SIGSTOP) inside the block, continued after it."""
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)


def assert_all_gone(procs) -> None:
    for proc in procs:
        proc.join(timeout=10)
        assert not proc.is_alive()


def test_a_worker_killed_while_idle_is_seen_within_seconds(tp2):
    """No request flows: check_health() (which the server's idle loop calls) names the rank
    and its signal; it used to go unseen until the next request failed with BrokenPipe."""
    procs = list(tp2.llm_engine.executor.procs)
    tp2.llm_engine.check_health()  # all well
    os.kill(procs[1].pid, signal.SIGKILL)
    message, seconds = wait_for_failure(tp2.llm_engine, timeout=5)
    assert "rank 1" in message and "SIGKILL" in message and seconds < 5
    assert_all_gone(procs)
    with pytest.raises(WorkerFailure, match="rank 1"):  # and so does every later use
        tp2.generate([[1, 2, 3]], SamplingParams(max_tokens=2))


def test_a_worker_killed_mid_generation_is_named_first(tp2):
    """Not its peer, whose collective the death broke (it reports a gloo error first at
    times): the failure's first line, which clients read, names the killed rank."""
    engine = tp2.llm_engine
    procs = list(engine.executor.procs)
    engine.add_request("r", [1, 2, 3], SamplingParams(max_tokens=400, ignore_eos=True))
    engine.step()
    os.kill(procs[1].pid, signal.SIGKILL)
    with pytest.raises(WorkerFailure) as failure:
        while True:
            engine.step()
    assert str(failure.value).splitlines()[0] == (
        "worker rank 1 died (killed by SIGKILL); no group of the node is left to serve")
    assert_all_gone(procs)


@pytest.fixture
def tp2_beating(tiny_llama_dir):
    """tp2 with a 2 s heartbeat timeout and a step timeout far above it."""
    llm = LLM(tiny_llama_dir, device="cpu", dtype="float32", skip_tokenizer_init=True,
              num_blocks=64, tensor_parallel_size=2, worker_timeout_s=300,
              worker_heartbeat_timeout_s=2)
    yield llm
    llm.llm_engine.shutdown()


def test_a_stopped_idle_worker_is_dead_within_2_s(tp2_beating):
    """The kernel shows it stopped: dead after 1 s of silence (not the 2 s heartbeat
    timeout of a running worker)."""
    engine = tp2_beating.llm_engine
    procs = list(engine.executor.procs)
    with stopped(procs[0]):
        message, seconds = wait_for_failure(engine, timeout=10)
    assert "rank 0" in message and "no heartbeat" in message and "process is stopped" in message
    assert 0.5 < seconds < 2
    assert_all_gone(procs)


def test_a_request_in_flight_fails_within_seconds_when_a_worker_stops(tp2_beating):
    """Not after worker_timeout_s (300 s here, 600 s by default)."""
    engine = tp2_beating.llm_engine
    procs = list(engine.executor.procs)
    engine.add_request("r", [1, 2, 3], SamplingParams(max_tokens=100, ignore_eos=True))
    assert engine.step()  # the prefill ran: the request is running
    with stopped(procs[1]):
        start = time.monotonic()
        with pytest.raises(WorkerFailure, match="rank 1.*no heartbeat"):
            while True:
                engine.step()
        assert time.monotonic() - start < 6
    assert_all_gone(procs)


def test_a_long_step_keeps_the_heartbeat(tmp_path):
    """A step longer than the heartbeat timeout (a 2048-token prefill, 4-8 s on a busy 2-core
    CPU): the worker's heartbeat thread beats through it, so the step is not failed."""
    model = save_tiny_llama(tmp_path / "wide", hidden_size=768, intermediate_size=3072,
                            num_hidden_layers=8, num_attention_heads=12, num_key_value_heads=4,
                            max_position_embeddings=LONG_PROMPT + 16)
    llm = LLM(model, device="cpu", dtype="float32", skip_tokenizer_init=True, num_blocks=160,
              tensor_parallel_size=2, worker_heartbeat_timeout_s=1,
              max_num_batched_tokens=LONG_PROMPT, long_prefill_token_threshold=0)  # one step
    try:
        prompt = [1 + i % 500 for i in range(LONG_PROMPT)]
        out = llm.generate([prompt], SamplingParams(max_tokens=1))
        assert len(out[0].outputs[0].token_ids) == 1
        (step,) = llm.llm_engine.take_step_records()
        assert step.num_tokens == LONG_PROMPT
        assert step.seconds > 1.5, f"a {step.seconds:.1f} s step is too short to show anything"
        llm.llm_engine.check_health()
    finally:
        llm.llm_engine.shutdown()


def close_pipe_then_exit(conn) -> None:
    conn.close()
    time.sleep(0.3)
    os._exit(3)


def test_the_exit_code_of_a_worker_whose_pipe_closed_first():
    """A failure reported as the pipe closes named "exit code None": the process was not
    yet reaped. It is joined briefly first."""
    ctx = process_start.worker_context()  # how the executor starts its workers
    parent, child = ctx.Pipe()
    proc = process_start.worker_process(ctx, close_pipe_then_exit, (child,), name="exit-3")
    proc.start()
    child.close()
    with pytest.raises(EOFError):
        parent.recv_bytes()
    assert _exit_status(proc) == "exit code 3"
