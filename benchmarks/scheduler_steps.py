"""The scheduler alone (no model, no engine): N running decodes with async scheduling, each
step scheduled while the previous one is in flight, then that one's tokens applied; the
median host time of `Scheduler.schedule` and `Scheduler.update` per step. Inside the engine
the same calls take several times these figures (the rest of the step takes the caches);
`--evict-caches` runs a pass over 32 MB of memory and 20,000 dicts between steps.

Usage: python3 benchmarks/scheduler_steps.py [--batch-sizes 256 1024] [--prefix-caching]
[--evict-caches] [--steps 400]"""
import argparse
import gc
import json
import statistics
import time

import numpy as np

from parashift.config import SchedulerConfig
from parashift.engine.scheduler import Scheduler
from parashift.engine.sequence import Sequence
from parashift.kv.block_manager import BlockManager
from parashift.sampling_params import SamplingParams

BLOCK_SIZE, CONTEXT, EOS = 16, 64, 2


def running_scheduler(batch: int, steps: int, prefix_caching: bool) -> Scheduler:
    """A scheduler with `batch` prompts admitted and prefilled, decoding from then on."""
    max_len = CONTEXT + steps + 64
    blocks = BlockManager(batch * (max_len // BLOCK_SIZE + 1), BLOCK_SIZE,
                          enable_prefix_caching=prefix_caching)
    config = SchedulerConfig(max_model_len=max_len, max_num_seqs=batch,
                             max_num_batched_tokens=max(8192, batch * CONTEXT))
    scheduler = Scheduler(config, blocks, eos_token_ids={EOS})
    params = SamplingParams(max_tokens=steps + 32, ignore_eos=True)
    for i in range(batch):
        prompt = [1000 + 7 * i + j for j in range(CONTEXT)]  # no two share a block
        scheduler.add(Sequence(f"r{i}", prompt, params))
    return scheduler


def measure(batch: int, steps: int, prefix_caching: bool, evict_caches: bool) -> dict:
    scheduler = running_scheduler(batch, steps, prefix_caching)
    prompts = scheduler.schedule()
    scheduler.update(prompts, [5] * prompts.num_chunks)
    in_flight = scheduler.schedule()
    evict = _cache_evictor() if evict_caches else (lambda: None)
    scheduling, updating = [], []
    gc.disable()
    try:
        for _ in range(steps):
            evict()
            start = time.perf_counter()
            step = scheduler.schedule()
            scheduled = time.perf_counter()
            scheduler.update(in_flight, [7] * in_flight.num_chunks)
            scheduling.append(scheduled - start)
            updating.append(time.perf_counter() - scheduled)
            if step.num_decodes != batch:
                raise RuntimeError(f"{step.num_decodes} of {batch} sequences decoded")
            in_flight = step
    finally:
        gc.enable()
    return dict(batch=batch, prefix_caching=prefix_caching, evict_caches=evict_caches,
                schedule_us=round(statistics.median(scheduling) * 1e6, 1),
                update_us=round(statistics.median(updating) * 1e6, 1))


def _cache_evictor():
    memory = np.zeros(4 << 20)  # 32 MB
    records = [{"a": i, "b": str(i)} for i in range(20000)]

    def evict():
        memory.sum()
        sum(record["a"] for record in records)
    return evict


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--prefix-caching", action="store_true")
    p.add_argument("--evict-caches", action="store_true")
    args = p.parse_args()
    for batch in args.batch_sizes:
        print(json.dumps(measure(batch, args.steps, args.prefix_caching, args.evict_caches)),
              flush=True)


if __name__ == "__main__":
    main()
