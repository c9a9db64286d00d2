"""The engine makes the collector's passes rare while it serves and gives the process its
thresholds back when it shuts down (parashift/gc_tuning.py)."""
import gc

from parashift.gc_tuning import GC_THRESHOLDS
from tests.engine.conftest import tiny_llm


def test_engine_tunes_the_collector_while_it_serves_and_restores_it(tiny_llama_dir):
    saved = gc.get_threshold()  # another test's engine may have tuned it already
    gc.set_threshold(700, 10, 10)
    try:
        llm = tiny_llm(tiny_llama_dir)
        try:
            assert gc.get_threshold() == GC_THRESHOLDS
            assert gc.get_freeze_count() > 0
        finally:
            llm.llm_engine.shutdown()
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*saved)
