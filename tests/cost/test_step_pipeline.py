"""A pipelined step in the cost model (exact on hand-made profiles): micro-batches cut as
the model runner cuts them (by tokens, none under the least), decodes in the stages'
graphs, each stage's launches from its own host, and the stage's busy time and lag that
the simulator schedules stages by."""
import math

from parashift.cost.step import Seq, StepBatch, StepModel
from parashift.parallel.plan import Plan
from tests.cost.test_profile import link
from tests.cost.test_step import SHAPE, compute

LINKS = link(names=("all_reduce", "all_gather", "send_recv"))


def test_decodes_run_whole_and_a_long_prompt_is_cut_by_tokens():
    model = StepModel(SHAPE, compute(), LINKS, micro_batch_tokens=256)
    decodes = StepBatch.decode(64, 100)
    assert model._micro_batches(Plan(pp=2), decodes) == [decodes]
    parts = model._micro_batches(Plan(pp=2), StepBatch((Seq(300, 0), Seq(1, 50), Seq(211, 0))))
    assert [p.tokens for p in parts] == [256, 256]
    assert parts[0].seqs == (Seq(256, 0),)
    assert parts[1].seqs == (Seq(44, 256), Seq(1, 50), Seq(211, 0))


def test_a_stage_is_busy_for_its_layers_and_the_next_starts_a_micro_batch_later():
    model = StepModel(SHAPE, compute(), LINKS, micro_batch_tokens=256)
    batch = StepBatch.prefill(512)
    step = model.step(Plan(pp=2), batch)
    whole = model.step(Plan(), batch).parts["gemm"]
    assert whole / 2 < step.parts["gemm"] < whole  # half the layers, weights read twice
    device = sum(v for k, v in step.parts.items()
                 if k in ("gemm", "attention", "elementwise", "send_recv"))
    assert math.isclose(step.stage_s, device, rel_tol=1e-12)
    assert math.isclose(step.lag_s, step.stage_s / 2, rel_tol=1e-12)
    assert math.isclose(step.parts["pipeline_fill"], step.lag_s, rel_tol=1e-12)
    assert math.isclose(step.total, step.stage_s + step.lag_s + step.parts["lm_head"]
                        + step.parts["sampler"], rel_tol=1e-12)


def test_pipelined_decodes_replay_graphs_and_eager_prompts_launch_per_stage():
    c = compute(eager_launch_s=1e-3, host_step_s=2e-6, kernels_per_layer=5)
    model = StepModel(SHAPE, c, LINKS)
    decode = model.step(Plan(pp=2), StepBatch.decode(4, 10))
    assert decode.parts["host"] == 2e-6  # a graph replay's host work, not launches
    prompt = model.step(Plan(pp=2), StepBatch.prefill(100))
    stage_launches = (5 * SHAPE.num_layers / 2 + 10) * 1e-3  # one stage's layers only
    assert math.isclose(prompt.stage_s, stage_launches, rel_tol=1e-12)  # host-bound
