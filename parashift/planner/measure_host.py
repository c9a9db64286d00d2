"""`parashift profile`'s host work per step and per sequence, measured on the engine itself:
decode steps of a small model (PROBE: two layers of kernel-friendly widths, random weights)
at a few batch sizes, each step's wall time less its device time as the profile being
measured predicts it (small: the step is mostly the engine's host work), fitted as per step
+ batch x per sequence (fit.host_line)."""
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from parashift.cost.fit import host_line
from parashift.cost.profile import ComputeProfile
from parashift.cost.shape import ModelShape
from parashift.cost.step import StepBatch, StepModel
from parashift.parallel.plan import Plan

PROBE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
         "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8,
         "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 2048,
         "max_position_embeddings": 512, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
         "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
PROMPT, WARM, TIMED = 16, 3, 24


def measure_host(profile: ComputeProfile, device: torch.device, batches: tuple
                 ) -> ComputeProfile:
    """`profile` with host_step_s and host_seq_s measured (and their points in its notes)."""
    from parashift.entrypoints.llm import LLM
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "host-probe.json"
        config.write_text(json.dumps(PROBE))
        llm = LLM(model=str(config), device=device.type, skip_tokenizer_init=True,
                  dtype="bfloat16" if device.type == "cuda" else "float32",
                  max_model_len=PROMPT + WARM + TIMED + 8, max_num_seqs=max(batches),
                  enable_prefix_caching=False,
                  max_num_batched_tokens=max(2048, PROMPT * max(batches)))
        try:
            walls = [(batch, _decode_step_s(llm.llm_engine, batch)) for batch in batches]
        finally:
            llm.llm_engine.shutdown()
    shape = ModelShape.of_config(PROBE, "host-probe")
    if device.type != "cuda":
        shape = replace(shape, dtype_bytes=4)
    model = StepModel(shape, profile, graphs=device.type == "cuda")
    points = []
    for batch, wall in walls:
        device_s = model.step(Plan(), StepBatch.decode(batch, PROMPT + WARM)).total
        points.append((batch, max(wall - device_s, 0.0)))
    per_step, per_seq = host_line(points)
    notes = dict(profile.notes, host={
        "how": "decode steps of a 2-layer model on the engine: wall less the predicted "
               "device time",
        "points": [[b, round(s, 9)] for b, s in points]})
    return replace(profile, host_step_s=per_step, host_seq_s=per_seq, notes=notes)


def _decode_step_s(engine, batch: int) -> float:
    """Median seconds of one engine step while `batch` sequences decode."""
    from parashift.sampling_params import SamplingParams
    params = SamplingParams(temperature=0, max_tokens=WARM + TIMED + 2, ignore_eos=True,
                            output_kind="final_only")
    for i in range(batch):
        engine.add_request(f"host-{batch}-{i}", [(7 * i + j) % 2000 + 1 for j in range(PROMPT)],
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
