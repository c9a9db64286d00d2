"""`parashift profile`'s host work per step and per sequence, measured on the engine itself: decode steps of a
tiny model (benchmarks/shapes/tiny-llama.json, random weights) at a few batch sizes, each
step's wall time less its device time as the profile being measured predicts it (small:
the model is tiny, so the step is the engine's host work), fitted as per step + batch x
per sequence (fit.host_line)."""
import time
from dataclasses import replace

import torch

from parashift.cost.fit import host_line
from parashift.cost.profile import ComputeProfile
from parashift.cost.shape import SHAPES, load_shape
from parashift.cost.step import StepBatch, StepModel
from parashift.parallel.plan import Plan

SHAPE = SHAPES / "tiny-llama.json"
PROMPT, WARM, TIMED = 16, 3, 24


def measure_host(profile: ComputeProfile, device: torch.device, batches: tuple
                 ) -> ComputeProfile:
    """`profile` with host_step_s and host_seq_s measured (and their points in its notes)."""
    from parashift.entrypoints.llm import LLM
    llm = LLM(model=str(SHAPE), device=device.type, skip_tokenizer_init=True,
              dtype="bfloat16" if device.type == "cuda" else "float32",
              max_model_len=PROMPT + WARM + TIMED + 8, max_num_seqs=max(batches),
              enable_prefix_caching=False,
              max_num_batched_tokens=max(2048, PROMPT * max(batches)))
    try:
        walls = [(batch, _decode_step_s(llm.llm_engine, batch)) for batch in batches]
    finally:
        llm.llm_engine.shutdown()
    model = StepModel(load_shape(str(SHAPE)), profile, graphs=device.type == "cuda")
    points = []
    for batch, wall in walls:
        device_s = model.step(Plan(), StepBatch.decode(batch, PROMPT + WARM)).total
        points.append((batch, max(wall - device_s, 0.0)))
    per_step, per_seq = host_line(points)
    notes = dict(profile.notes, host={
        "how": "decode steps of tiny-llama on the engine: wall less the predicted device time",
        "points": [[b, round(s, 9)] for b, s in points]})
    return replace(profile, host_step_s=per_step, host_seq_s=per_seq, notes=notes)


def _decode_step_s(engine, batch: int) -> float:
    """Median seconds of one engine step while `batch` sequences decode."""
    from parashift.sampling_params import SamplingParams
    params = SamplingParams(temperature=0, max_tokens=WARM + TIMED + 2, ignore_eos=True,
                            output_kind="final_only")
    for i in range(batch):
        engine.add_request(f"host-{batch}-{i}", [(7 * i + j) % 500 + 1 for j in range(PROMPT)],
                           params)
    for _ in range(WARM):  # the prompts, then decodes settling
        engine.step()
    samples = []
    for _ in range(TIMED):
        start = time.perf_counter()
        engine.step()
        samples.append(time.perf_counter() - start)
    while engine.has_unfinished_requests():
        engine.step()
    samples.sort()
    return samples[len(samples) // 2]
