"""The garbage collector while serving (the engine's process and every worker's)."""
import gc

# The collector's thresholds while serving. Python's (700, 10, 10) ran a full collection every
# few decode steps at 512-1024 running sequences: 4.3-7.0 ms per step on average (8B shape, one
# H200, docs/benchmark_log.md); with (100,000, 50, 1,000) no pass ran in 60 steps. Cycles are
# still collected: a young pass after 100,000 net allocations of tracked objects, a full one
# after 100,000 x 50 x 100.
GC_THRESHOLDS = (100_000, 50, 100)
_saved: list[tuple[int, ...]] = []  # the thresholds before each tune, innermost last


def tune_garbage_collector() -> None:
    """Moves what start-up made (modules, configs, the tokenizer) out of the collector's
    scans and makes its passes rare: a process-wide setting, as vLLM's engine core does,
    undone by `restore_garbage_collector`."""
    gc.collect()
    gc.freeze()
    _saved.append(gc.get_threshold())
    gc.set_threshold(*GC_THRESHOLDS)


def restore_garbage_collector() -> None:
    """An engine shut down: what it froze can be collected again (its tensors may sit in
    reference cycles), with the thresholds from before its tune."""
    gc.unfreeze()
    if _saved:
        gc.set_threshold(*_saved.pop())
