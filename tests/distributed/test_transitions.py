"""Transitions of the node layout mid-generation give the single-device greedy tokens:
a no-op (every phase run, nothing changed) and a re-shard of a group's plan, on one
process and on real gloo groups; the other groups keep stepping meanwhile."""
import json

import pytest

from parashift import LLM
from parashift.engine.policy import Decision, Transition
from tests.distributed.test_plans import COMMON, PARAMS, assert_same, prompts
from tests.engine.conftest import save_tiny_llama
from tests.helpers.policies import TransitionScript


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    model_dir = save_tiny_llama(tmp_path_factory.mktemp("gqa8x4"), num_attention_heads=8,
                                num_key_value_heads=4, hidden_size=96, intermediate_size=192,
                                num_hidden_layers=3)
    llm = LLM(model_dir, **COMMON)
    try:
        return model_dir, llm.generate(prompts(), PARAMS)
    finally:
        llm.llm_engine.shutdown()


def run_with_transitions(model_dir, tmp_path, group, targets, kind, **options):
    timeline = tmp_path / "timeline.jsonl"
    llm = LLM(model_dir, **{**COMMON, "timeline_file": str(timeline), **options})
    engine = llm.llm_engine
    try:
        script = TransitionScript(engine, group, targets, every=3, kind=kind)
        engine.set_policy(script)
        outputs = llm.generate(prompts(), PARAMS)
        records = engine.take_transition_records()
        return outputs, records, engine.layout, timeline
    finally:
        engine.shutdown()


def test_noop_transitions_on_one_device(model, tmp_path):
    model_dir, reference = model
    outputs, records, layout, timeline = run_with_transitions(
        model_dir, tmp_path, 0, ["single"], "noop")
    assert_same(outputs, reference)
    assert len(records) >= 3 and all(r.kind == "noop" and r.groups == (0,) for r in records)
    assert any(r.moved > 0 for r in records) and all(r.reprefilled == 0 for r in records)
    assert all(r.drain_s >= 0 and r.prepare_s >= 0 and r.cutover_s >= 0 for r in records)
    lines = [json.loads(line) for line in timeline.read_text().splitlines()]
    assert sum("transition" in line for line in lines) == len(records)
    assert layout.name() == "single"


def test_reshard_between_shift_plans_mid_generation(model, tmp_path):
    """The group's base plan alternates SP=2 and TP=2 over SP_TP (one KV layout)."""
    model_dir, reference = model
    outputs, records, layout, _ = run_with_transitions(
        model_dir, tmp_path, 0, ["shift-tp2", "sp2"], "reshard",
        sequence_parallel_size=2, parallel_policy="shift")
    assert_same(outputs, reference)
    assert [r.target for r in records[:2]] == [("shift-tp2",), ("sp2",)]
    assert layout.plans[0].name() in ("sp2", "shift-tp2")


@pytest.mark.parametrize("layout, group, target", [("tp2,single", 1, "single@2"),
                                                   ("single,single,tp2", 2, "tp2@2-3")])
def test_noop_on_one_group_while_others_serve(model, tmp_path, layout, group, target):
    """On 3 and 4 ranks: one group transitions again and again, the others keep serving."""
    model_dir, reference = model
    outputs, records, final, _ = run_with_transitions(
        model_dir, tmp_path, group, [target], "noop", layout=layout)
    assert_same(outputs, reference)
    assert records and all(r.groups == (group,) for r in records)
    assert final.plans[group].name() == target


def assert_refused(model_dir, decision: Decision, message: str) -> None:
    """An engine whose policy always answers `decision` refuses it with `message`."""
    llm = LLM(model_dir, **COMMON)
    engine = llm.llm_engine

    class Fixed:
        name, plans = "fixed", engine.policy_plans

        def decide(self, view):
            return decision
    try:
        engine.set_policy(Fixed())
        with pytest.raises(ValueError, match=message):
            llm.generate(prompts(), PARAMS)
    finally:
        engine.shutdown()


def test_a_transition_the_engine_cannot_make_is_refused(model):
    merge = Transition("merge", (0,), ("single",))  # a merge of one group
    assert_refused(model[0], Decision(("single",), (merge,)), "cannot end in")


def test_a_plan_that_does_not_run_on_the_group_is_refused(model):
    assert_refused(model[0], Decision(("single@1",)), "runs on ranks")
