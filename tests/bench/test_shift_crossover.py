"""benchmarks/shift_crossover.py on two gloo ranks: every point is timed under both plans
with its batch whole, a batch the KV pool cannot hold is recorded rather than fatal, and
the suggested threshold skips it."""
import importlib.util
from pathlib import Path

from parashift import LLM

ROOT = Path(__file__).parents[2]


def load_benchmark():
    spec = importlib.util.spec_from_file_location(
        "shift_crossover", ROOT / "benchmarks" / "shift_crossover.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_crossover_rows_and_a_batch_that_does_not_fit():
    crossover = load_benchmark()
    llm = LLM(model=str(ROOT / "benchmarks/shapes/tiny-llama.json"), dtype="float32",
              device="cpu", skip_tokenizer_init=True, max_model_len=200, num_blocks=40,
              enable_prefix_caching=False, parallel_policy="shift", sequence_parallel_size=2,
              max_num_seqs=16)
    try:
        engine = llm.llm_engine
        base, shift = (plan.name() for plan in engine.policy_plans)
        assert (base, shift) == ("sp2", "shift-tp2")
        # 4 sequences of 64 + 9 tokens take 4 x 5 blocks of 16; 16 would take 80 of the 40
        assert crossover.fits(llm, 4, 64, 2) and not crossover.fits(llm, 16, 64, 2)
        rows = [crossover.measure(llm, n, 64, 2) for n in (1, 4, 16)]
        rows.append(crossover.measure_prefill(llm, 100, repeats=1))
        for row in rows[:2] + rows[3:]:
            assert row[base] > 0 and row[shift] > 0
        assert rows[2] == {"tokens": 16, "does_not_fit": 40}
        assert rows[3]["prefill"] and rows[3]["tokens"] == 100
        assert not engine.has_unfinished_requests()
        rows[0][shift], rows[1][shift] = rows[0][base] / 2, rows[1][base] / 2
        rows[3][shift] = rows[3][base] * 2
        assert crossover.suggested_threshold(rows, base, shift) == 4
    finally:
        llm.llm_engine.shutdown()
