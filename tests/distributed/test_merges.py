"""Merges and splits of the node layout mid-generation (ranks change groups) give the
single-device greedy tokens: replicas merge into one TP group over their full copies of
the weights, the new group reads the KV pool in its plan's view, the waiting requests of
the groups involved move to it, and the running ones finish in the plan their KV was
written in (soft or hard preemption) or are computed again (recompute, counted). Under
every weight mode (`--merge-weights`) the tokens are the reference's, and each rank's
parameters are byte-identical before the first merge and after the last split: the rows
are laid out once at load and a merge or split moves none."""
import json

import pytest

from parashift import LLM, SamplingParams
from parashift.parallel.layout import Layout
from tests.distributed.test_plans import (COMMON, PARAMS, assert_same, generate, prompts,
                                          skip_unless_enough_gpus)
from tests.distributed.test_transitions import model  # noqa: F401 - the module's model
from tests.engine.conftest import save_tiny_llama
from tests.helpers.policies import LayoutCycle


def checksums(engine) -> list[str]:
    return engine.executor.collective_rpc("weights_checksum")


def run_cycle(model_dir, tmp_path, start: str, cycle: list[str], limit: int, every: int = 2,
              params=PARAMS, at_once: bool = False, **options):
    """Generates under a LayoutCycle. How many of its `limit` transitions happen before the
    requests finish depends on which replica's step ends first: tests assert a prefix.
    Asserts that no rank's weights changed and returns their checksums."""
    skip_unless_enough_gpus(dict(layout=start))
    timeline = tmp_path / "timeline.jsonl"
    llm = LLM(model_dir, **{**COMMON, "timeline_file": str(timeline), "layout": start,
                            "parallel_policy": "flying", **options})
    engine = llm.llm_engine
    try:
        before = checksums(engine)
        engine.set_policy(LayoutCycle(engine, [Layout.parse(spec) for spec in cycle], every, limit,
                                      at_once))
        outputs = llm.generate(prompts(n=8), params)
        records = engine.take_transition_records()
        free = [r.block_manager.num_free_blocks == r.block_manager.num_blocks
                for r in engine.replicas]
        assert not any(r.is_left_behind for r in engine.replicas)  # all finished and dropped
        assert checksums(engine) == before
        return outputs, records, timeline, free, before
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def reference(one_device):
    return one_device.generate(prompts(n=8), PARAMS)


@pytest.fixture(scope="module")
def loaded_checksum(one_device):
    """The single-device replica's checksum, rows in loading order."""
    return checksums(one_device.llm_engine)[0]


MODES = ["view", "materialize", "reorder"]
LONG = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=4)


@pytest.fixture(scope="module")
def long_reference(one_device):
    """Longer requests: room for four merges and splits before they finish."""
    return one_device.generate(prompts(n=8), LONG)


@pytest.mark.parametrize("mode", MODES)
def test_widths_two_four_two(model, long_reference, tmp_path, mode):
    """On 4 ranks: 1 -> 2, then 2 -> 4 -> 2 (-> 4 ...); each rank holds a width-2 and a
    width-4 layout (under reorder: one permutation serves both)."""
    outputs, records, _, free, _ = run_cycle(
        model[0], tmp_path, "single,single,single,single",
        ["merge2-tp2,merge2-tp2", "merge4-tp4"], limit=10, every=1, params=LONG,
        merge_weights=mode)
    assert_same(outputs, long_reference)
    targets = [r.target for r in records]
    expected = [("merge2-tp2",), ("merge2-tp2@2-3",)] + [
        ("merge4-tp4",), ("merge2-tp2", "merge2-tp2@2-3")] * 4
    assert len(targets) >= 4 and targets == expected[:len(targets)]
    assert all(free)


@pytest.mark.parametrize("mode,preemption", [
    ("reorder", "soft"), ("reorder", "hard"), ("reorder", "recompute"), ("view", "soft"),
    ("materialize", "soft")])
def test_merge_and_split_back_mid_generation(model, reference, loaded_checksum, tmp_path, mode,
                                             preemption):
    """Two replicas merge into TP=2 and split again, over and over, requests in flight, under
    each weight mode (only reorder lays the replica's rows out anew, once, at load). Soft and
    hard preemption keep every running request's KV where it was written; recompute
    computes them again in their new group."""
    outputs, records, timeline, free, weights = run_cycle(
        model[0], tmp_path, "single,single", ["merge2-tp2", "single,single"], limit=4,
        merge_weights=mode, flying_preemption=preemption)
    assert_same(outputs, reference)
    assert (weights == [loaded_checksum] * 2) == (mode != "reorder")
    kinds = [r.kind for r in records]
    assert 2 <= len(kinds) <= 4 and kinds == ["merge", "split", "merge", "split"][:len(kinds)]
    assert records[0].target == ("merge2-tp2",)
    assert records[1].target == ("single", "single@1")
    if preemption == "recompute":
        assert any(r.reprefilled > 0 for r in records) and all(r.kept == 0 for r in records)
    else:
        assert all(r.reprefilled == 0 for r in records) and records[0].kept > 0
    assert all(r.moved >= r.reprefilled for r in records)
    assert all(free)  # every block came back
    lines = [json.loads(line) for line in timeline.read_text().splitlines()]
    assert sum("transition" in line for line in lines) == len(records)
    merge, split = [i for i, line in enumerate(lines) if "transition" in line][:2]
    if preemption == "soft":  # the requests written at width 1 went on, under their plan
        assert {line["plan"] for line in lines[merge + 1:split]} & {"single", "single@1"}


def test_widths_one_two_four_and_back(model, reference, tmp_path):
    """On 4 ranks: 1 -> 2 -> 4 -> 2 -> 1, a merge of merged groups included."""
    outputs, records, _, free, _ = run_cycle(
        model[0], tmp_path, "single,single,single,single",
        ["merge2-tp2,merge2-tp2", "merge4-tp4", "merge2-tp2,merge2-tp2",
         "single,single,single,single"], limit=6, every=1)
    assert_same(outputs, reference)
    expected = [("merge2-tp2",), ("merge2-tp2@2-3",), ("merge4-tp4",),
                ("merge2-tp2", "merge2-tp2@2-3"), ("single", "single@1"), ("single@2", "single@3")]
    targets = [r.target for r in records]
    assert len(targets) >= 3 and targets == expected[:len(targets)]
    assert all(free)


def test_four_replicas_merge_at_once_and_split_in_two(model, reference, tmp_path):
    """1 -> 4 directly, then the width-4 group splits into two width-2 groups."""
    outputs, records, _, free, _ = run_cycle(
        model[0], tmp_path, "single,single,single,single",
        ["merge4-tp4", "merge2-tp2,merge2-tp2"], limit=2, every=1)
    assert_same(outputs, reference)
    assert [r.target for r in records] == [("merge4-tp4",), ("merge2-tp2", "merge2-tp2@2-3")]
    assert records[0].groups == (0, 1, 2, 3) and all(free)


@pytest.mark.parametrize("mode", ["soft", "recompute"])
def test_four_replicas_merge_pairwise_in_one_transition_mid_generation(model, long_reference,
                                                                        tmp_path, mode):
    """Both pairs merge at once (Flying's way to a width: one transition, groups renumbered
    once), mid-generation, then split back a pair at a time."""
    outputs, records, _, free, _ = run_cycle(
        model[0], tmp_path, "single,single,single,single",
        ["merge2-tp2,merge2-tp2", "single,single,single,single"], limit=3, every=3,
        params=LONG, at_once=True, flying_preemption=mode)
    assert_same(outputs, long_reference)
    assert records and (records[0].kind, records[0].groups, records[0].target) == (
        "merge", (0, 1, 2, 3), ("merge2-tp2", "merge2-tp2@2-3"))
    assert [r.kind for r in records[1:]] == ["split", "split"][:len(records) - 1]
    assert all(free)


def test_tp_replicas_merge_into_a_wider_tp_group(model, reference, tmp_path):
    """Two TP=2 replicas merge into TP=4 (each rank uses half its TP shard) and back."""
    outputs, records, _, free, _ = run_cycle(
        model[0], tmp_path, "tp2,tp2", ["merge2-tp4", "tp2,tp2"], limit=2, every=1)
    assert_same(outputs, reference)
    assert [r.kind for r in records[:2]] == ["merge", "split"]
    assert all(free)


def test_a_node_can_start_merged(model, reference):
    """Ranks that start in a merged plan load full replicas and run as TP=2."""
    skip_unless_enough_gpus(dict(layout="merge2-tp2"))
    llm = LLM(model[0], **{**COMMON, "layout": "merge2-tp2"})
    try:
        assert_same(llm.generate(prompts(n=8), PARAMS), reference)
        assert llm.llm_engine.replicas[0].block_manager.block_size == 2 * 16
    finally:
        llm.llm_engine.shutdown()


def test_two_replicas_merge_while_a_third_keeps_serving(model, long_reference, tmp_path):
    """On 3 ranks: groups 0 and 1 merge and split while rank 2's replica keeps stepping
    (its steps in flight across the renumbering of the groups). Longer requests: room for
    the merge and the split whichever replica's steps end first."""
    outputs, records, _, free, _ = run_cycle(
        model[0], tmp_path, "single,single,single", ["merge2-tp2,single", "single,single,single"],
        limit=4, params=LONG)
    assert_same(outputs, long_reference)
    groups = [r.groups for r in records]
    assert 2 <= len(groups) <= 4 and groups == [(0, 1), (0,), (0, 1), (0,)][:len(groups)]
    assert all(free)


@pytest.fixture(scope="module")
def six_heads(tmp_path_factory):
    """Six heads and three KV heads: they split over three ranks."""
    model_dir = save_tiny_llama(tmp_path_factory.mktemp("gqa6x3"), num_attention_heads=6,
                                num_key_value_heads=3, hidden_size=96, intermediate_size=192,
                                num_hidden_layers=3)
    return model_dir, generate(model_dir, prompts(n=8))[0]


def test_three_replicas_merge_into_tp3_and_split(six_heads, tmp_path):
    model_dir, reference = six_heads
    outputs, records, _, free, _ = run_cycle(
        model_dir, tmp_path, "single,single,single", ["merge3-tp3", "single,single,single"],
        limit=2, every=1)
    assert_same(outputs, reference)
    assert [r.target for r in records] == [("merge3-tp3",), ("single", "single@1", "single@2")]
    assert all(free)


MIXED = [SamplingParams(max_tokens=16, ignore_eos=True, logprobs=2,
                        **({"temperature": 0} if i % 2 else
                           {"temperature": 0.9, "top_p": 0.95, "seed": 1000 + i}))
         for i in range(8)]


@pytest.mark.parametrize("preemption", ["soft", "recompute"])
def test_seeded_samples_are_the_reference_across_merges_and_splits(model, one_device, tmp_path,
                                                                   preemption):
    """A mixed batch, greedy and seeded sampling: a seeded request draws as a function of its
    seed and position, so neither a merge (its steps now on two ranks), a split, nor being
    computed again changes its tokens."""
    reference = one_device.generate(prompts(n=8), MIXED)
    outputs, records, *_ = run_cycle(model[0], tmp_path, "single,single",
                                     ["merge2-tp2", "single,single"], limit=4, params=MIXED,
                                     flying_preemption=preemption)
    assert len(records) >= 2
    assert_same(outputs, reference)
