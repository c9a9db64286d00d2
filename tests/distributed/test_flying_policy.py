"""The flying policy on two gloo ranks: an administrator's width merges the replicas while
requests run and handing the layout back lets the policy split them; a request that one
replica cannot hold waits for the policy to merge a group that does. Every request gives
the single-device greedy tokens."""
import random

import pytest

from parashift import LLM, SamplingParams
from parashift.engine.policy.cost import SwitchCosts
from tests.distributed.test_plans import (COMMON, PARAMS, assert_same, prompts,
                                          skip_unless_enough_gpus)
from tests.distributed.test_transitions import model  # noqa: F401 - the module's model

FLYING = dict(data_parallel_size=2, parallel_policy="flying", flying_dwell_s=0.0)


def run_until_done(engine, outputs: dict, records: list, on_step=None) -> None:
    while engine.has_unfinished_requests():
        for output in engine.step():
            outputs[output.request_id] = output
        records += engine.take_transition_records()
        if on_step is not None:
            on_step(records)


@pytest.fixture(scope="module")
def reference(one_device):
    return one_device.generate(prompts(n=8), PARAMS)


def test_forced_width_merges_while_requests_run_and_the_policy_splits_after(model, reference,
                                                                            one_device):
    """Once the width is handed back, a queue (8 more requests) makes the policy split."""
    skip_unless_enough_gpus(FLYING)
    later = prompts(seed=1, n=8)
    later_reference = one_device.generate(later, PARAMS)
    # merge_running 0: with requests running the policy itself keeps the replicas apart
    llm = LLM(model[0], **{**COMMON, **FLYING, "flying_merge_running": 0})
    engine = llm.llm_engine
    try:
        for index, prompt in enumerate(prompts(n=8)):
            engine.add_request(str(index), prompt, PARAMS)
        outputs, records = {}, []
        for _ in range(2):
            outputs.update((o.request_id, o) for o in engine.step())
        assert engine.layout.name() == "single,single@1"
        llm.set_layout(2)
        assert engine.layout_info()["forced_width"] == 2

        def hand_back(done):
            if [r.kind for r in done] == ["merge"] and engine.layout_info()["forced_width"]:
                assert engine.layout.name() == "merge2-tp2"
                llm.set_layout(None)
                for index, prompt in enumerate(later):
                    engine.add_request(f"later-{index}", prompt, PARAMS)
        run_until_done(engine, outputs, records, hand_back)
        assert [(r.kind, r.target) for r in records][:2] == [
            ("merge", ("merge2-tp2",)), ("split", ("single", "single@1"))]
        assert records[0].moved + records[0].kept > 0  # requests were there across the merge
        assert_same([outputs[str(i)] for i in range(8)], reference)
        assert_same([outputs[f"later-{i}"] for i in range(8)], later_reference)
        assert all(r.block_manager.num_free_blocks == r.block_manager.num_blocks
                   for r in engine.replicas)
    finally:
        engine.shutdown()


LONG = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=4)


def test_a_request_one_replica_cannot_hold_waits_for_a_merge(model, one_device):
    """Each replica holds 20 blocks of 16 tokens (320); merged, 20 blocks of 32 (640, capped
    at max_model_len 512): a 400-token prompt with max_tokens 12 needs 412, which only the
    merged group holds. The other requests run beside it."""
    skip_unless_enough_gpus(FLYING)
    rng = random.Random(1)
    long_prompt = [rng.randrange(512) for _ in range(400)]
    batch = [long_prompt, *prompts(n=3)]
    reference = one_device.generate(batch, LONG)
    llm = LLM(model[0], **{**COMMON, **FLYING, "num_blocks": 20, "flying_merge_running": 0})
    engine = llm.llm_engine
    try:
        assert [w["max_context"] for w in engine.layout_info()["widths"]] == [320, 512]
        assert engine.kv_tokens_by_width() == {1: 320, 2: 640}
        outputs = llm.generate(batch, LONG)
        assert_same(outputs, reference)
        records = engine.take_transition_records()
        assert records[0].kind == "merge" and records[0].target == ("merge2-tp2",)
        llm.set_layout(1)
        with pytest.raises(ValueError, match="needs 412 tokens.*the 320 .* forced width 1"):
            engine.add_request("too-long", long_prompt, LONG)
    finally:
        engine.shutdown()


def test_a_priority_request_binds_a_tp_group_at_once(model):
    """Four requests run apart (the policy would keep them so, and its dwell has not
    passed); a request of priority -1 merges the replicas at once."""
    skip_unless_enough_gpus(FLYING)
    batch = prompts(n=5)
    expected = model[1]  # the module's reference: prompts(n=5) on one device
    llm = LLM(model[0], **{**COMMON, **FLYING, "flying_merge_running": 0,
                           "flying_dwell_s": 600.0})
    engine = llm.llm_engine
    try:
        for index, prompt in enumerate(batch[:4]):
            engine.add_request(str(index), prompt, PARAMS)
        outputs, records = {}, []
        for _ in range(2):
            outputs.update((o.request_id, o) for o in engine.step())
        assert engine.layout.name() == "single,single@1"
        engine.add_request("4", batch[4], PARAMS, priority=-1)
        run_until_done(engine, outputs, records)
        assert [(r.kind, r.target) for r in records] == [("merge", ("merge2-tp2",))]
        assert_same([outputs[str(i)] for i in range(5)], expected)
    finally:
        engine.shutdown()


def test_a_forget_queued_by_a_split_waits_while_a_merge_keeps_the_request(model, one_device):
    """A runs merged; B arrives and a split moves it to the first replica, queueing a forget
    of B on the second (which has no request, so no step to send it with). A merge under
    hard preemption keeps B where it runs and hands that forget to the merged group: it
    must not reach rank 0 while B lives there. While A is left behind by the split, the
    policy sees it as running load."""
    skip_unless_enough_gpus(FLYING)
    long, short = list(range(1, 71)), list(range(5, 30))
    expected = one_device.generate([long, short], PARAMS)
    llm = LLM(model[0], **{**COMMON, **FLYING, "flying_preemption": "hard"})
    engine = llm.llm_engine
    outputs = {}

    def step():
        outputs.update((o.request_id, o) for o in engine.step())

    def force(width, name):
        llm.set_layout(width)
        while engine.layout.name() != name:
            step()
    try:
        engine.add_request("A", long, PARAMS)
        force(2, "merge2-tp2")
        step()  # A's first chunk takes the step's budget
        engine.add_request("B", short, PARAMS)
        force(1, "single,single@1")
        assert [g.num_running for g in engine.view().groups] == [1, 0]  # A, left behind
        step()  # B runs on rank 0
        force(2, "merge2-tp2")
        left_behind = [r for r in engine.replicas if r.is_left_behind]
        assert [[s.request_id for s in r.scheduler.running] for r in left_behind] == [["B"]]
        while engine.has_unfinished_requests():
            step()
        assert_same([outputs["A"], outputs["B"]], expected)
    finally:
        engine.shutdown()


def test_random_arrivals_and_priorities_give_the_reference_tokens(model, one_device, monkeypatch):
    """Requests of random lengths arrive a few per step, one in four urgent, under the
    policy's own merges and splits (no dwell): every request gives the single-device
    tokens and the node does not flap between widths (a split that left its requests
    behind once looked idle, and the policy merged and split again at every step).
    The policy's step time and merge speedup are pinned: measured, they made the decisions
    differ by device (on four H200s a graph-capturing merge and millisecond steps left no
    split to check)."""
    skip_unless_enough_gpus(FLYING)
    monkeypatch.setattr(SwitchCosts, "step_seconds", lambda self, view: 0.05)
    monkeypatch.setattr(SwitchCosts, "speedup",  # the assumed one (measured, it is the device's)
                        lambda self, view, factor, merged=(): factor * self.efficiency)
    rng = random.Random(1)
    batch = prompts(seed=1, n=40)
    params = [SamplingParams(temperature=0, max_tokens=rng.randint(2, 20), ignore_eos=True)
              for _ in batch]
    reference = [o.outputs[0].token_ids for o in one_device.generate(batch, params)]
    llm = LLM(model[0], **{**COMMON, **FLYING, "flying_merge_running": 2})
    engine = llm.llm_engine
    outputs, records, added = {}, [], 0
    try:
        while added < len(batch) or engine.has_unfinished_requests():
            for _ in range(rng.choice([0, 0, 1, 3])):
                if added < len(batch):
                    engine.add_request(str(added), batch[added], params[added],
                                       priority=rng.choice([0, 0, 0, -1]))
                    added += 1
            outputs.update((o.request_id, o.outputs[0].token_ids) for o in engine.step())
            records += engine.take_transition_records()
            assert len(records) < 20, [r.kind for r in records]
        assert [outputs[str(i)] for i in range(len(batch))] == reference
        assert records  # the policy did merge and split
        # a split moved a merged group's running requests (cheaper than keeping them)
        assert any(r.kind == "split" and r.reprefilled for r in records), records
    finally:
        engine.shutdown()


def test_the_view_carries_the_prompt_rate_its_plan_measured(model):
    """A long prompt's step measures its plan's prompt tokens a second per rank, which the
    switch costs read (before: a fixed 8,192 a replica, whatever the device), and its decode
    steps the step time (a prompt's step no longer counts as one once a decode step has)."""
    skip_unless_enough_gpus(FLYING)
    llm = LLM(model[0], **{**COMMON, **FLYING, "max_num_batched_tokens": 1024})
    engine = llm.llm_engine
    try:
        llm.set_layout(1)  # the replicas stay: their view is there to read after the run
        assert all(g.prefill_tokens_per_s == 0 for g in engine.view().groups)
        engine.add_request("long", list(range(1, 301)), PARAMS)
        while engine.has_unfinished_requests():
            engine.step()
        one_token = SamplingParams(temperature=0, max_tokens=1)
        engine.add_request("last", [2 + i * 7 % 400 for i in range(300)], one_token)
        while engine.has_unfinished_requests():
            engine.step()
        records = engine.take_step_records()
        views = dict(zip((p.name() for p in engine.layout.plans), engine.view().groups))
        last_prompt = records[-1]  # "last": a prompt step after "long"'s decode steps
        assert last_prompt.num_tokens == 300
        ranks = len(engine.node.plans_by_name[last_prompt.plan].ranks)
        view = views[last_prompt.plan]
        assert view.prefill_tokens_per_s == pytest.approx(300 / last_prompt.seconds / ranks)
        # the decode step time is the plan's last decode step's, not its last prompt's
        decodes = [r for r in records if r.plan == last_prompt.plan and r.num_tokens == 1]
        assert decodes and view.step_s == decodes[-1].seconds
    finally:
        engine.shutdown()


def test_requests_paused_for_a_priority_request_resume_once_it_ends(model, one_device):
    """A and B run on the two replicas; a forced merge under hard preemption leaves them
    behind, paused while the merged group serves the urgent U. Once U ends they run again,
    beside C (default priority) in the merged group, instead of waiting for that group to
    empty (under steady arrivals it never does)."""
    skip_unless_enough_gpus(FLYING)
    batch = prompts(seed=3, n=4)
    # A and B long enough to both be running when the merge is forced: a replica never
    # waits for another, and on a loaded CI host A once ended (24 tokens) before B's
    # replica returned its first step
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=4)
              for n in (96, 96, 3, 120)]
    names = ["A", "B", "U", "C"]
    reference = one_device.generate(batch, params)
    llm = LLM(model[0], **{**COMMON, **FLYING, "flying_preemption": "hard"})
    engine = llm.llm_engine
    outputs = {}

    def step():
        outputs.update((o.request_id, o) for o in engine.step())

    def generated(request_id):
        """Its tokens so far, wherever it is: a replica's queues, or unplaced while no
        group holds it (between a layout's groups)."""
        held = [s for r in engine.replicas for s in (*r.scheduler.running, *r.scheduler.waiting)]
        held += engine.node.unplaced.values()
        found = [s.num_output_tokens for s in held if s.request_id == request_id]
        assert found, (f"request {request_id} is in no queue: layout "
                       f"{engine.layout.name()}, output {outputs.get(request_id)}")
        return found[0]
    try:
        for name, prompt, p in zip(names[:2], batch, params):
            engine.add_request(name, prompt, p)
        while min(generated("A"), generated("B")) == 0:
            step()
        llm.set_layout(2)
        while engine.layout.name() != "merge2-tp2":
            step()
        engine.add_request("U", batch[2], params[2], priority=-1)
        engine.add_request("C", batch[3], params[3])
        paused = generated("A"), generated("B")
        while "U" not in outputs or not outputs["U"].finished:
            step()
            assert (generated("A"), generated("B")) == paused  # U's group outranks them
        while generated("A") == paused[0]:
            step()
        assert generated("C") < params[3].max_tokens  # A ran while C still did
        while engine.has_unfinished_requests():
            step()
        assert_same([outputs[name] for name in names], reference)
    finally:
        engine.shutdown()


def test_an_idle_node_merges_before_the_next_request(model, reference):
    """With nothing to run the policy is asked anyway (`idle_turn`): the replicas merge
    with no request to carry the change, so the next one meets the merged group instead
    of waiting for the merge. A static node never changes."""
    skip_unless_enough_gpus(FLYING)
    llm = LLM(model[0], **{**COMMON, **FLYING})
    engine = llm.llm_engine
    try:
        assert engine.layout.name() == "single,single@1"
        assert engine.idle_turn()
        assert engine.layout.name() == "merge2-tp2"
        records = engine.take_transition_records()
        assert [(r.kind, r.target, r.moved) for r in records] == [("merge", ("merge2-tp2",), 0)]
        assert not engine.idle_turn()  # already the idle node's layout
        assert_same(llm.generate(prompts(n=8), PARAMS), reference)
        measured = dict(engine.view().decode_step_s)  # each plan that decoded, its median
        assert measured and set(measured) <= {"single", "single@1", "merge2-tp2"}
        assert all(0 < seconds < 60 for seconds in measured.values())
    finally:
        engine.shutdown()
    static = LLM(model[0], **{**COMMON, "data_parallel_size": 2})
    try:
        assert not static.llm_engine.idle_turn()
        assert static.llm_engine.layout.name() == "single,single@1"
    finally:
        static.llm_engine.shutdown()


def test_an_idle_node_stays_apart_where_the_merged_plan_decodes_slower(model):
    """The decode steps the engine measured reach the policy: with the merged plan's
    steps slower than the replicas', an idle node does not merge; faster, it does."""
    from collections import deque
    skip_unless_enough_gpus(FLYING)
    llm = LLM(model[0], **{**COMMON, **FLYING})
    engine = llm.llm_engine
    try:
        steps = {"single": 0.004, "single@1": 0.005}
        engine.node.decode_s = {plan: deque([s])
                                for plan, s in {**steps, "merge2-tp2": 0.006}.items()}
        assert not engine.idle_turn() and engine.layout.name() == "single,single@1"
        engine.node.decode_s["merge2-tp2"] = deque([0.003, 0.002, 0.1])  # median 3 ms
        assert engine.idle_turn() and engine.layout.name() == "merge2-tp2"
    finally:
        engine.shutdown()


def test_a_server_merges_an_idle_node_without_a_request(model):
    """The server's engine thread gives the policy its idle turn while it waits: the node
    merges with no request sent (without the turn it waits for one)."""
    import asyncio
    import time

    from parashift.engine.async_engine import AsyncLLMEngine
    skip_unless_enough_gpus(FLYING)
    llm = LLM(model[0], **{**COMMON, **FLYING})
    engine = llm.llm_engine

    async def main():
        async_engine = AsyncLLMEngine(engine)
        async_engine.start()
        try:
            deadline = time.monotonic() + 30
            while engine.layout.name() != "merge2-tp2" and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            return engine.layout.name()
        finally:
            await async_engine.shutdown()
    try:
        assert asyncio.run(main()) == "merge2-tp2"
        assert not engine.has_unfinished_requests()
    finally:
        engine.shutdown()
