"""The persistent step state (the ranks' block-table rows updated by deltas, the previous
samples' index by row; the scheduler's running table) against a from-scratch rebuild every
step (`check_step_state`), under random adds, aborts, preemptions and finishes."""
import random

import pytest

from parashift import SamplingParams
from parashift.step.message import StepStateMismatch
from parashift.worker import step_chunks
from tests.engine.conftest import tiny_llama_dir, tiny_llm  # noqa: F401 (a fixture)


def random_traffic(engine, steps: int, seed: int) -> dict:
    """Drives `steps` engine steps of random traffic; returns what happened."""
    rng = random.Random(seed)
    shared = [rng.randrange(1, 500) for _ in range(40)]  # a prefix some prompts share
    live, seen, n = set(), dict(added=0, aborted=0, finished=0), 0
    for _ in range(steps):
        for _ in range(rng.choice((0, 0, 0, 0, 0, 1, 1, 2))):
            length = rng.randrange(1, 70)
            prompt = (shared[:rng.randrange(0, 40)] if rng.random() < 0.4 else []) + \
                [rng.randrange(1, 500) for _ in range(length)]
            params = SamplingParams(max_tokens=rng.randrange(1, 48), ignore_eos=True,
                                    temperature=rng.choice((0.0, 0.8)),
                                    seed=rng.choice((None, rng.randrange(1000))))
            engine.add_request(f"r{n}", prompt, params)
            live.add(f"r{n}")
            n += 1
            seen["added"] += 1
        if live and rng.random() < 0.08:
            victim = rng.choice(sorted(live))
            engine.abort_request(victim)
            live.discard(victim)
            seen["aborted"] += 1
        for output in engine.step():
            assert output.error is None, output.error
            if output.finished and output.request_id in live:
                live.discard(output.request_id)
                seen["finished"] += 1
    seen["preempted"] = engine.stats().num_preemptions
    return seen


def test_persistent_state_equals_a_rebuild_over_500_random_steps(tiny_llama_dir):
    llm = tiny_llm(tiny_llama_dir, num_blocks=40, block_size=8, max_num_seqs=12,
                   max_model_len=160, check_step_state=True)
    try:
        seen = random_traffic(llm.llm_engine, 500, seed=1)
    finally:
        llm.llm_engine.shutdown()
    assert llm.llm_engine.steps_in_flight == 2  # async scheduling: placeholders every step
    print(seen)
    assert seen["added"] > 150 and seen["aborted"] > 10 and seen["finished"] > 100
    assert seen["preempted"] > 5


def test_the_check_catches_a_lost_block_id(tiny_llama_dir, monkeypatch):
    write = step_chunks.RequestTables._write

    def drops_the_last_block(self, row, start, block_ids):
        write(self, row, start, block_ids[:-1] if len(block_ids) > 1 else block_ids)
    monkeypatch.setattr(step_chunks.RequestTables, "_write", drops_the_last_block)
    llm = tiny_llm(tiny_llama_dir, block_size=8, check_step_state=True)
    try:
        with pytest.raises(StepStateMismatch, match="block table"):
            llm.generate([list(range(1, 40))], SamplingParams(max_tokens=4))
    finally:
        llm.llm_engine.shutdown()


def test_the_check_catches_a_running_table_column_left_behind(tiny_llama_dir, monkeypatch):
    """The scheduler's running table, as if a decode's token were appended without its
    count: the check names the column."""
    from parashift.engine import scheduler
    update = scheduler.Scheduler._update_decodes

    def loses_a_count(self, decodes, sampled, finished):
        update(self, decodes, sampled, finished)
        self.table.tokens[decodes.slots[0]] -= 1
    monkeypatch.setattr(scheduler.Scheduler, "_update_decodes", loses_a_count)
    llm = tiny_llm(tiny_llama_dir, block_size=8, check_step_state=True)
    try:
        with pytest.raises(StepStateMismatch, match="running table.*tokens"):
            llm.generate([list(range(1, 40)), list(range(3, 30))], SamplingParams(max_tokens=6))
    finally:
        llm.llm_engine.shutdown()


def test_the_check_catches_a_wrong_argmax_only_flag(tiny_llama_dir, monkeypatch):
    def marks_every_row(self, request_id, row):
        self.argmax_only[row] = True
    monkeypatch.setattr(step_chunks.RequestTables, "_mark_argmax_only", marks_every_row)
    llm = tiny_llm(tiny_llama_dir, block_size=8, check_step_state=True)
    try:
        with pytest.raises(StepStateMismatch, match="argmax_only"):
            llm.generate([list(range(1, 40))], SamplingParams(max_tokens=4, temperature=0.8))
    finally:
        llm.llm_engine.shutdown()


def test_the_check_catches_a_staging_slot_reused_too_soon(tiny_llama_dir, monkeypatch):
    """One slot for a prefill step's two packs: the sampled rows' pack overwrites the
    step's inputs (after they were read here; on a GPU, before a later kernel might read
    them)."""
    from parashift.uploads import StagingRing
    from parashift.worker import model_runner
    monkeypatch.setattr(model_runner, "StagingRing", lambda device: StagingRing(device, depth=1))
    llm = tiny_llm(tiny_llama_dir, block_size=8, check_step_state=True)
    try:
        with pytest.raises(StepStateMismatch, match="an upload of this step"):
            llm.generate([list(range(1, 40)), list(range(3, 30))], SamplingParams(max_tokens=6))
    finally:
        llm.llm_engine.shutdown()
