"""`parashift profile`'s host work per step and per sequence, measured on the engine itself:
decode steps of a small model (PROBE: two layers of kernel-friendly widths, random weights)
at a few batch sizes, each step's wall time less its device time as the profile being
measured predicts it (small: the step is mostly the engine's host work), fitted as per step
+ batch x per sequence (fit.host_line). On CUDA also eager steps of two depths: the host
time the extra layers' kernels add, per kernel (eager_launch_s). And lone requests (one
prompt, one token, nothing else in flight, as benchmarks/prefill_throughput.py times them)
from admission to output, less the step's device time: the host work around a step that no
other step overlaps (admission, scheduling, inputs, output), per request and per prompt
token (lone_host_s, lone_host_token_s)."""
import gc
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
EAGER_DEPTHS = (2, 8)
POOL_SHARE = 0.3  # of the device's memory for the probe's engine (it needs little)
# lone prompts' lengths: on CUDA mixed-graph buckets (worker/cuda_graphs.py MIXED_ROWS)
LONE_PROMPTS = {"cuda": (256, 1024, 2048), "cpu": (16, 64)}
LONE_REPEATS = 7


def measure_host(profile: ComputeProfile, device: torch.device, batches: tuple
                 ) -> ComputeProfile:
    """`profile` with host_step_s and host_seq_s measured (graph steps on CUDA), and on CUDA
    eager_launch_s (eager steps of two depths: the host time a layer's kernels add); the
    points in its notes."""
    cuda = device.type == "cuda"
    walls = _walls(device, PROBE, batches, cuda_graphs=None)
    points = [(b, max(wall - _device_s(profile, PROBE, _decodes(b), cuda), 0.0))
              for b, wall in walls]
    per_step, per_seq = host_line(points)
    notes = {"how": "decode steps of a 2-layer model on the engine: wall less the predicted "
                    "device time", "points": [[b, round(s, 9)] for b, s in points]}
    changes = {"host_step_s": per_step, "host_seq_s": per_seq, "host_overlapped": cuda}
    if cuda:
        changes["eager_launch_s"], notes["eager"] = _eager_launch_s(profile, device)
    lone, notes["lone"] = lone_host(profile, device)
    changes["lone_host_s"], changes["lone_host_token_s"] = lone
    return replace(profile, **changes, notes=dict(profile.notes, host=notes))


def lone_host(profile: ComputeProfile, device: torch.device) -> tuple[tuple[float, float], dict]:
    """((per request, per prompt token) seconds, notes) of a lone request's host work: the
    probe's lone prompts (graphs where the device has them) from admission to output, less
    the prefill step's device time as `profile` predicts it."""
    lengths = LONE_PROMPTS["cuda" if device.type == "cuda" else "cpu"]
    walls = _lone_walls(device, lengths)
    cuda = device.type == "cuda"
    points = [(n, max(wall - _device_s(profile, PROBE, StepBatch.prefill(n), cuda), 0.0))
              for n, wall in walls]
    return host_line(points), {
        "how": "lone prompts of a 2-layer model, one token each, admission to output, less "
               "the predicted device time of the step",
        "points": [[n, round(s, 9)] for n, s in points],
        "walls": [[n, round(s, 9)] for n, s in walls]}


def _lone_walls(device: torch.device, lengths: tuple) -> list[tuple[int, float]]:
    """(prompt tokens, median wall seconds from admission to output of a lone prompt)."""
    from parashift.entrypoints.llm import LLM
    _release(device)
    longest = max(lengths)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "host-probe.json"
        path.write_text(json.dumps(dict(PROBE, max_position_embeddings=longest + 16)))
        llm = LLM(model=str(path), device=device.type, skip_tokenizer_init=True,
                  dtype="bfloat16" if device.type == "cuda" else "float32",
                  max_model_len=longest + 16, max_num_seqs=8, enable_prefix_caching=False,
                  gpu_memory_utilization=POOL_SHARE, max_num_batched_tokens=longest)
        try:
            return [(n, lone_request_s(llm.llm_engine, n, LONE_REPEATS)) for n in lengths]
        finally:
            llm.llm_engine.shutdown()
            del llm
            _release(device)


def lone_request_s(engine, length: int, repeats: int) -> float:
    """Median seconds from adding a `length`-token prompt (one token out) to its end, the
    engine idle before (the first of repeats + 1 warms up)."""
    from parashift.sampling_params import SamplingParams
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    times = []
    for i in range(repeats + 1):
        prompt = [(13 * i + 7 * j) % 2000 + 1 for j in range(length)]
        start = time.perf_counter()
        engine.add_request(f"lone-{length}-{i}", prompt, params)
        while engine.has_unfinished_requests():
            engine.step()
        times.append(time.perf_counter() - start)
    times = sorted(times[1:])
    return times[len(times) // 2]


def _eager_launch_s(profile: ComputeProfile, device: torch.device) -> tuple[float, dict]:
    """Host seconds per kernel of an eager layer: batch-1 eager steps of EAGER_DEPTHS layers,
    the extra layers' wall (less their predicted device time) over their kernels."""
    walls = {}
    for layers in EAGER_DEPTHS:
        config = dict(PROBE, num_hidden_layers=layers)
        wall = _walls(device, config, (1,), cuda_graphs=False)[0][1]
        walls[layers] = wall - _device_s(profile, config, _decodes(1), False)
    low, high = EAGER_DEPTHS
    per_kernel = (walls[high] - walls[low]) / ((high - low) * profile.kernels_per_layer)
    return max(per_kernel, 0.0), {"how": "eager batch-1 steps: host seconds by layers",
                                  "points": [[n, round(s, 9)] for n, s in walls.items()]}


def _device_s(profile: ComputeProfile, config: dict, batch: StepBatch, graphs: bool) -> float:
    """The probe's step of `batch` on the device as `profile` predicts it (its host terms
    0; a step that prefills in a mixed graph where `graphs`)."""
    shape = ModelShape.of_config(config, "host-probe")
    if profile.device == "cpu":
        shape = replace(shape, dtype_bytes=4)
    bare = replace(profile, host_step_s=0.0, host_seq_s=0.0, eager_launch_s=0.0)
    return StepModel(shape, bare, graphs=graphs, prefill_graphs=graphs).step(
        Plan(), batch).total


def _decodes(batch: int) -> StepBatch:
    return StepBatch.decode(batch, PROMPT + WARM)


def _walls(device: torch.device, config: dict, batches: tuple, cuda_graphs: bool | None
           ) -> list[tuple[int, float]]:
    """(batch, median wall seconds of a decode step) on an engine of `config`'s shape."""
    from parashift.entrypoints.llm import LLM
    _release(device)  # what the kernels' timing cached, before the engine sizes its pool
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "host-probe.json"
        path.write_text(json.dumps(config))
        llm = LLM(model=str(path), device=device.type, skip_tokenizer_init=True,
                  dtype="bfloat16" if device.type == "cuda" else "float32",
                  max_model_len=PROMPT + WARM + TIMED + 8, max_num_seqs=max(batches),
                  enable_prefix_caching=False, cuda_graphs=cuda_graphs,
                  gpu_memory_utilization=POOL_SHARE,
                  max_num_batched_tokens=max(2048, PROMPT * max(batches)))
        try:
            return [(batch, _decode_step_s(llm.llm_engine, batch)) for batch in batches]
        finally:
            llm.llm_engine.shutdown()
            del llm
            _release(device)


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


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
