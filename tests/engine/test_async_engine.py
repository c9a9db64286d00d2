"""AsyncLLMEngine on a tiny random Llama: streaming, abort, back-pressure, a dead
engine and shutdown."""
import asyncio

import pytest

from parashift.engine.async_engine import AsyncLLMEngine, EngineDeadError, QueueFullError
from parashift.engine.llm_engine import EngineStats
from parashift.metrics import ServerMetrics
from parashift.sampling_params import SamplingParams
from tests.engine.conftest import tiny_llm

LONG = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)


@pytest.fixture(scope="module")
def llm_engine(tiny_llama_dir):
    return tiny_llm(tiny_llama_dir, max_num_seqs=2).llm_engine


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=60))


async def started(engine, **options) -> AsyncLLMEngine:
    async_engine = AsyncLLMEngine(engine, **options)
    async_engine.start()
    return async_engine


def test_streams_cumulative_outputs_like_the_sync_engine(llm_engine, tiny_llama_dir):
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    expected = tiny_llm(tiny_llama_dir).generate([[5, 6, 7]], params)[0].outputs[0].token_ids

    async def main():
        async_engine = await started(llm_engine)
        lengths, last = [], None
        async for output in async_engine.generate("a", [5, 6, 7], params):
            lengths.append(len(output.outputs[0].token_ids))
            last = output
        await async_engine.shutdown()
        return lengths, last
    lengths, last = run(main())
    assert lengths == sorted(lengths) and lengths[-1] == 12
    assert last.finished and last.outputs[0].token_ids == expected


def test_a_lagging_reader_of_delta_outputs_gets_them_joined(llm_engine, tiny_llama_dir):
    """The reader sleeps between outputs, so several wait at each read: a delta stream
    joins them (a cumulative one would give the newest); joined, they are the request's
    tokens, and the metrics count each token once."""
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, output_kind="delta")
    expected = tiny_llm(tiny_llama_dir).generate([[5, 6, 7]], params)[0].outputs[0].token_ids
    metrics = ServerMetrics("tiny")

    async def main():
        async_engine = await started(llm_engine, metrics=metrics)
        pieces = []
        async for output in async_engine.generate("lag", [5, 6, 7], params):
            pieces.append(output.outputs[0].token_ids)
            await asyncio.sleep(0.05)
        await async_engine.shutdown()
        return pieces
    pieces = run(main())
    assert [t for piece in pieces for t in piece] == expected
    assert len(pieces) < len(expected)  # some reads joined several outputs
    assert metrics.generation_tokens._value.get() == len(expected)


def test_concurrent_requests_and_metrics(llm_engine):
    metrics = ServerMetrics("tiny")
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)

    async def one(async_engine, i):
        final = None
        async for output in async_engine.generate(f"r{i}", [1 + i, 2, 3], params):
            final = output
        return len(final.outputs[0].token_ids)

    async def main():
        async_engine = await started(llm_engine, metrics=metrics)
        counts = await asyncio.gather(*(one(async_engine, i) for i in range(5)))
        await async_engine.shutdown()
        return counts
    assert run(main()) == [5] * 5
    assert metrics.generation_tokens._value.get() == 25
    assert metrics.ttft._sum.get() > 0


def test_final_only_request_gets_one_output_and_its_first_token_time(llm_engine):
    """What the server asks for a non-streaming request: one output, at the end, and still
    a time to first token measured when the first token came, not when the output did."""
    metrics = ServerMetrics("tiny")
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True).final_only()

    async def main():
        async_engine = await started(llm_engine, metrics=metrics)
        outputs = [o async for o in async_engine.generate("final", [4, 5, 6], params)]
        await async_engine.shutdown()
        return outputs
    outputs = run(main())
    assert len(outputs) == 1 and outputs[0].finished
    assert len(outputs[0].outputs[0].token_ids) == 40
    ttft, e2e = metrics.ttft._sum.get(), metrics.e2e._sum.get()
    assert 0 < ttft < e2e
    assert metrics.tpot._sum.get() > 0


def test_transitions_reach_the_metrics(tiny_llama_dir):
    """A server's /metrics carry each committed transition's drain, prepare and cutover."""
    from tests.helpers.policies import TransitionScript
    engine = tiny_llm(tiny_llama_dir).llm_engine
    engine.set_policy(TransitionScript(engine, 0, ["single"], every=2, kind="noop"))
    metrics = ServerMetrics("tiny")

    async def main():
        async_engine = await started(engine, metrics=metrics)
        async for _ in async_engine.generate("r", [1, 2, 3], LONG):
            pass
        await async_engine.shutdown()
    run(main())
    text = metrics.render()[0].decode()
    cutovers = [line for line in text.splitlines() if line.startswith(
        "parashift_transition_duration_seconds_count") and 'phase="cutover"' in line]
    assert cutovers and float(cutovers[0].split()[-1]) >= 10
    moved = [line for line in text.splitlines() if line.startswith(
        "parashift_transition_requests_total") and 'fate="moved"' in line]
    assert moved and float(moved[0].split()[-1]) >= 10  # a no-op moves its one request each time
    engine.shutdown()


def test_abort_frees_blocks(llm_engine):
    async def main():
        async_engine = await started(llm_engine)
        stream = await async_engine.add_request("long", [1, 2, 3], LONG)
        async for output in stream:
            if len(output.outputs[0].token_ids) >= 3:
                break
        assert llm_engine.stats().num_free_blocks < llm_engine.stats().num_total_blocks
        async_engine.abort("long")
        for _ in range(200):
            if not llm_engine.has_unfinished_requests():
                break
            await asyncio.sleep(0.01)
        await async_engine.shutdown()
    run(main())
    stats = llm_engine.stats()
    assert not llm_engine.has_unfinished_requests()
    assert stats.num_free_blocks == stats.num_total_blocks


def test_bad_input_raises_value_error_and_engine_lives_on(llm_engine):
    async def main():
        async_engine = await started(llm_engine)
        for prompt in ([], [10 ** 6]):
            with pytest.raises(ValueError):
                await async_engine.add_request(f"bad{len(prompt)}", prompt, LONG)
        assert async_engine.is_running
        stream = await async_engine.add_request("ok", [1], SamplingParams(max_tokens=2))
        outputs = [o async for o in stream]
        await async_engine.shutdown()
        return outputs
    assert run(main())[-1].finished


def test_queue_full(llm_engine):
    async def main():
        async_engine = await started(llm_engine, max_num_queued_requests=1)
        running = []
        for i in range(2):  # max_num_seqs=2: both run once they produced a token
            stream = await async_engine.add_request(f"run{i}", [1, 2], LONG)
            await anext(aiter(stream))
            running.append(stream)
        await async_engine.add_request("waits", [1, 2], LONG)
        with pytest.raises(QueueFullError):
            await async_engine.add_request("refused", [1, 2], LONG)
        await async_engine.shutdown()
        return running
    run(main())
    assert not llm_engine.has_unfinished_requests()


class Exploding:
    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def step(self):
        self._inner.step()
        raise RuntimeError("boom")


def test_dead_engine_fails_pending_and_new_requests(llm_engine):
    async def main():
        async_engine = await started(Exploding(llm_engine))
        with pytest.raises(EngineDeadError):
            async for _ in async_engine.generate("x", [1, 2], LONG):
                pass
        assert not async_engine.is_running and async_engine.dead_error is not None
        with pytest.raises(EngineDeadError):
            await async_engine.add_request("y", [1, 2], LONG)
        await async_engine.shutdown()
    run(main())
    assert not llm_engine.has_unfinished_requests()


def test_shutdown_fails_pending_and_cleans_engine(llm_engine):
    async def main():
        async_engine = await started(llm_engine)
        stream = await async_engine.add_request("pending", [1, 2], LONG)
        await async_engine.shutdown()
        with pytest.raises(EngineDeadError):
            async for _ in stream:
                pass
        with pytest.raises(EngineDeadError):
            await async_engine.add_request("late", [1], LONG)
    run(main())
    assert not llm_engine.has_unfinished_requests()


def test_seesaw_transitions_and_phase_seconds_reach_the_metrics():
    """A seesaw re-shard's stall, weight and KV bytes, and the groups' phase seconds."""
    from parashift.engine.transitions import TransitionRecord
    metrics = ServerMetrics("tiny")
    record = TransitionRecord(0.0, "reshard", (0,), ("tp2",), 0.01, 0.02, 0.03, 2, 0, 0, 0.05,
                              "to_decode", 1000, 0.004, 300, 300, 600, 100)
    metrics.record_step(EngineStats(0, 0, 8, 8, 0), [], [record])
    metrics.record_phase_seconds({"prefill": 1.5, "decode": 2.0, "transition": 0.05, "idle": 0.0})
    lines = metrics.render()[0].decode().splitlines()

    def value(prefix, *labels):
        found = [line for line in lines if line.startswith(prefix) and all(x in line for x in labels)]
        assert len(found) == 1, (prefix, labels, found)
        return float(found[0].split()[-1])
    assert value("parashift_seesaw_transition_bytes_total", 'what="weights"', "to_decode") == 1000
    assert value("parashift_seesaw_transition_bytes_total", 'what="weights_from_peers"') == 600
    assert value("parashift_seesaw_transition_bytes_total", 'what="weights_from_host"') == 100
    assert value("parashift_seesaw_transition_bytes_total", 'what="kv_out"') == 300
    assert value("parashift_seesaw_transition_bytes_total", 'what="kv_in"') == 300
    assert value("parashift_seesaw_weight_seconds_total") == 0.004
    assert value("parashift_transition_duration_seconds_sum", 'phase="stall"') == 0.05
    assert value("parashift_seesaw_phase_seconds_total", 'phase="decode"') == 2.0
    assert not [line for line in lines if 'phase="idle"' in line and "seesaw_phase" in line
                and not line.startswith("#")]  # a phase with no time adds nothing
