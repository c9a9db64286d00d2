"""The simulator runs the real engine: on two gloo ranks with a tiny model, the same
arrivals give the same steps (plan, decodes, prompt chunks) under the cost model as under
the real workers, step for step (Shift over SP2, so that both small and large steps run)."""
import pytest

from parashift import LLM, SamplingParams
from parashift.bench.workloads import BenchRequest
from parashift.config import EngineConfig
from parashift.cost.profile import load
from parashift.cost.shape import ModelShape
from parashift.cost.step import StepModel
from parashift.cost.advisor import PROFILES
from parashift.planner.simulate import simulate
from tests.engine.conftest import save_tiny_llama

OPTIONS = dict(device="cpu", dtype="float32", skip_tokenizer_init=True, num_blocks=96,
               max_num_batched_tokens=40, sequence_parallel_size=2, parallel_policy="shift",
               shift_threshold=8, async_scheduling=False, output_processor="inline",
               enable_prefix_caching=False)
LENGTHS = [(30, 6), (12, 9), (50, 4), (7, 12), (21, 5)]


def step_of(plan: str, batch) -> tuple:
    return (plan, len(batch.decode_ids), tuple((c.request_id, len(c.token_ids), c.start_pos)
                                               for c in batch.chunks))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_sim"))


def real_steps(model_dir) -> list[tuple]:
    llm = LLM(model_dir, **OPTIONS)
    engine = llm.llm_engine
    seen, submit = [], engine.executor.submit

    def recording(tag, ranks, output_rank, batch):
        seen.append(step_of(batch.plan, batch))
        return submit(tag, ranks, output_rank, batch)
    engine.executor.submit = recording
    try:
        for index, (prompt, output) in enumerate(LENGTHS):
            tokens = [(index * 31 + k) % 511 + 1 for k in range(prompt)]
            engine.add_request(str(index), tokens, SamplingParams(
                temperature=0.0, max_tokens=output, ignore_eos=True))
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        llm.llm_engine.shutdown()
    return seen


def test_the_simulator_schedules_what_the_engine_schedules(model_dir):
    real = real_steps(model_dir)
    config = EngineConfig(model=model_dir, **OPTIONS)
    shape = ModelShape("tiny", 2, 64, 4, 2, 16, 128, 512)
    model = StepModel(shape, load(PROFILES / "h200_compute.json"),
                      load(PROFILES / "h200x2_link.json"))
    sim = simulate(config, model, [BenchRequest(i, p, o, 0.0) for i, (p, o) in enumerate(LENGTHS)])
    simulated = [(s["plan"], s["decodes"], tuple(s["chunks"])) for s in sim.steps]
    assert len(real) > 10 and {s[0] for s in real} == {"sp2", "shift-tp2"}
    assert simulated == real
    assert [r["tokens"] for r in sim.requests] == [o for _, o in LENGTHS]


def test_an_engine_with_a_cost_profile_runs_shift_at_the_models_crossover(model_dir):
    options = {k: v for k, v in OPTIONS.items() if k != "shift_threshold"}
    llm = LLM(model_dir, cost_profile=str(PROFILES / "h200_compute.json"), **options)
    try:
        from parashift.cost.advisor import advisor_for
        from parashift.parallel.plan import Plan
        engine = llm.llm_engine
        advisor = advisor_for(engine.config, engine._hf_config, 2)
        assert engine.policy.threshold == advisor.shift_threshold(Plan(sp=2)) > 0
        outputs = llm.generate([[1, 2, 3, 4, 5]], SamplingParams(max_tokens=4, ignore_eos=True))
        assert len(outputs[0].outputs[0].token_ids) == 4
    finally:
        llm.llm_engine.shutdown()
