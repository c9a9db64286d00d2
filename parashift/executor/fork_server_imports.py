"""What the workers' fork server imports before it forks any (process_start.PRELOAD; no
other process imports this): a worker's modules and its model's transformers config (Llama's
brings the base every other config module builds on). Only imports: nothing here touches a
device. What they made is frozen out of the collector's scans, so a forked worker's
start-up collection (gc_tuning) scans only what the worker itself makes."""
import gc

import parashift.worker.worker  # noqa: F401
import transformers.models.llama.configuration_llama  # noqa: F401

gc.collect()
gc.freeze()
