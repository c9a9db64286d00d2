"""Routing: which replica takes a new request, what each layout width holds, and the
refusal of a request no layout holds."""
import pytest

from parashift import SamplingParams
from parashift.engine.routing import (Slot, check_fits, group_capacity, max_context_by_width,
                                      need, route)
from parashift.parallel.layout import Layout
from parashift.parallel.plan import Plan
from tests.engine.conftest import tiny_llm

# two replicas of 2048 tokens each, and a merged pair of two more holding 4096
SLOTS = [Slot(load=3, group=0, width=1, capacity=2048), Slot(load=1, group=1, width=1,
                                                             capacity=2048),
         Slot(load=5, group=2, width=2, capacity=4096)]


def test_default_requests_go_to_the_least_loaded_replica():
    assert route(SLOTS, 100, priority=0) == 1
    assert route(SLOTS, 100, priority=5) == 1


def test_an_urgent_request_goes_to_the_widest_group():
    assert route(SLOTS, 100, priority=-1) == 2
    apart = [Slot(4, 0, 1, 2048), Slot(0, 1, 1, 2048)]
    assert route(apart, 100, priority=-1) == 0  # the group the policy merges from


def test_a_long_request_goes_to_a_group_that_holds_it():
    assert route(SLOTS, 3000, priority=0) == 2
    assert route(SLOTS, 4096, priority=0) == 2
    assert route(SLOTS, 4097, priority=0) is None  # waits for a wider merge


def test_need_is_prompt_and_max_tokens_within_the_context():
    assert need(100, 50, 2048) == 150
    assert need(100, None, 2048) == 2048  # without max_tokens it may run to the end
    assert need(2000, 500, 2048) == 2048  # generation stops at max_model_len


def test_a_request_no_layout_holds_is_refused_naming_its_length():
    check_fits(8192, 100, {1: 2048, 2: 8192})
    with pytest.raises(ValueError, match=r"needs 9000 tokens.*100 prompt.*the 8192 that the"):
        check_fits(9000, 100, {1: 2048, 2: 8192})
    with pytest.raises(ValueError, match="the 2048 .* at the forced width 1"):
        check_fits(3000, 100, {1: 2048, 2: 8192}, forced=1)


def test_max_context_per_width():
    replicas = list(Layout.of(Plan(dp=2)).plans)
    merged = Plan.merged(replicas)
    loaded = {0: replicas[0], 1: replicas[1]}
    # each rank holds 4 KV heads in 100 blocks of 16 tokens; merged, a rank holds 2 heads of
    # blocks of 32 tokens, and the ranks agree on the smaller pool
    assert group_capacity(replicas[0], [100, 90], loaded, 4, 16) == 1600
    assert group_capacity(merged, [100, 90], loaded, 4, 16) == 2880
    layouts = {1: ("single", "single@1"), 2: ("merge2-tp2",)}
    plans = {p.name(): p for p in [*replicas, merged]}
    capacity = {"single": 1600, "single@1": 1440, "merge2-tp2": 2880}
    assert max_context_by_width(layouts, plans, lambda p: capacity[p.name()]) == {
        1: 1600, 2: 2880}


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    llm = tiny_llm(tiny_llama_dir, num_blocks=40, max_model_len=512)
    yield llm
    llm.shutdown()


def test_the_engine_reports_its_layout_and_refuses_widths_it_cannot_take(llm):
    engine = llm.llm_engine
    info = engine.layout_info()
    assert info == {"groups": [{"ranks": [0], "plan": "single", "width": 1}],
                    "forced_width": None,
                    "widths": [{"width": 1, "plans": ["single"], "max_context": 512}]}
    assert engine.kv_tokens_by_width() == {1: 40 * 16}  # max_model_len caps it at 512
    with pytest.raises(ValueError, match=r"width 2 is not one this node can take; widths: \[1\]"):
        llm.set_layout(2)
    llm.set_layout(1)
    assert engine.layout_info()["forced_width"] == 1
    out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=3))
    assert len(out[0].outputs[0].token_ids) == 3
    llm.set_layout(None)
    assert engine.layout_info()["forced_width"] is None


def test_a_node_whose_largest_layout_cannot_hold_max_model_len_does_not_start(tiny_llama_dir):
    with pytest.raises(ValueError, match="max_model_len 512 exceeds the KV pool: the largest "
                                         "layout holds 320 tokens"):
        tiny_llm(tiny_llama_dir, num_blocks=20, max_model_len=512)
