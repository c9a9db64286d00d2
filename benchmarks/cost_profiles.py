"""The H200 profiles derived from docs/benchmark_log.md, until `parashift profile` measures them
on the machines: one H200's compute profile and the link profiles of two and four H200s
(benchmarks/results/profiles/). Every number names the log section it comes from; the few
parameters no single measurement gives are fitted to named rows (FIT_ROWS), which
benchmarks/cost_validation.py then marks as fitted, not held out.

Usage: python3 benchmarks/cost_profiles.py            # rewrite the three profiles
       python3 benchmarks/cost_profiles.py --check    # exit 1 if they differ
A profile `parashift profile` measured (its source does not start with "derived") is left
as it is."""
import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from decode_context import decode_context
from parashift.bench.workloads import WorkloadOptions, get_workload, sample_lengths
from parashift.cost import fit
from parashift.cost.profile import ComputeProfile, LinkProfile, Roofline, to_dict
from parashift.cost.runs import Served, offline_s
from parashift.cost.shape import load_shape
from parashift.cost.step import StepBatch, StepModel
from parashift.parallel.plan import Plan

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "profiles"
KiB, MiB = 1024, 1024 ** 2
GPU_FAST_PATH = "GPU fast path, one GPU (issue 6; 2026-11-22)"
COLLECTIVES_2 = "Collectives on two GPUs (issue 6; 2026-11-22)"
MAX_CONTEXT = "Max context per layout (issue 15, the paper's Table 2; 2026-11-23)"
MOE = "Mixtures of experts (issue 19; 2026-11-23): first GPU run"
FOUR_FIRST = "Four H200s: the first runs (issue 20; thirteenth session, 2026-11-26)"
FOUR_SECOND = "Four H200s, the second window (issue 20; fourteenth session, 2026-11-26)"
CEILINGS = "the workloads notes' ceilings (two H200s, 2026-11-21)"
RAW = ROOT / "benchmarks" / "results" / "raw"
FP8_GEMM_RAW = RAW / "issue60_fp8_gemm" / "fp8_gemm_first_w8a8.json"
FP8_GEMM = ("FP8-weight GEMMs of the 8B shape on one H200 (issue 60), "
            "benchmarks/results/raw/issue60_fp8_gemm/fp8_gemm_first_w8a8.json")
GEMM_RAWS = (FP8_GEMM_RAW, FP8_GEMM_RAW.with_name("fp8_gemm_rows_1_16_64_256.json"))
BF16_GEMM = ("bf16 GEMMs (cuBLAS) of the 8B shape's projections on one H200 beside issue 60's "
             "FP8 ones, benchmarks/results/raw/issue60_fp8_gemm/*.json")
SIXTEENTH = "Four H200s, the fourth window (issue 20; sixteenth session, 2026-11-26)"
PROBE = "SiDP probe: step time against the FFN fetch (issue 17; 2026-11-23, one nvidia-h200)"
PROBE_RAW = ROOT / "benchmarks" / "results" / "sidp_probe_h200.json"
QUICK_RAW = ROOT / "benchmarks" / "results" / "raw" / "cost_profile_h200_quick" / "h200_compute.json"
QUICK = ("`parashift profile --quick` on one H200, "
         "benchmarks/results/raw/cost_profile_h200_quick/h200_compute.json")
# the grouped expert GEMMs, profiled (MOE): 64 tokens 181 + 95 us against floors of 188 + 94
# us at the copy rate; 4,096 tokens 35.5 ms
MOE_GROUPED_BW_EFF = min(1.0, (188 + 94) / (181 + 95))
MOE_GROUPED_4096_S = 35.5e-3

# (what is fitted, the row it is fitted to: shape, what, measured seconds, section)
FIT_ROWS = {
    "gemm.flops_eff": ("llama-3.1-8b", "prefill 8192, eager", 227.4e-3, FOUR_SECOND),
    "prefill_attention.flops_eff": ("llama-3.1-8b", "prefill 2048, eager", 49.7e-3, FOUR_SECOND),
    "eager_launch_s": ("llama-3.1-8b", "prefill 512, eager", 18.1e-3, GPU_FAST_PATH),
    "gemm.overlap": ("qwen3-32b, llama-3.1-70b", "decode b128 ctx 1024, where neither the "
                     "weights' bytes nor the FLOPs dominate (the probe's, not in the "
                     "validation; their mean error nil)", "29.58e-3, 55.07e-3", PROBE),
    "moe.launch_s": ("qwen3-30b-a3b", "decode b1 ctx 1024", 4.6e-3, MOE),
    "moe_kernels_per_layer": ("qwen3-30b-a3b", "prefill 512, eager (host-bound)", 92.8e-3, MOE),
    "activation_bytes": ("llama-3.1-8b", "KV tokens on one H200 at 0.9", 886_048, MAX_CONTEXT),
    "sp_kernels_per_layer": ("llama-3.1-8b", "SP4 prefill 2048, eager (host-paced)", 38.8e-3,
                             FOUR_SECOND),
    "link4.all_reduce small-message factor": ("llama-3.1-8b", "TP4 TPOT, 2048 in / 128 out",
                                              2.762e-3, FOUR_FIRST),
    "cas_kernels_per_peer": ("llama-3.1-70b", "SiDP CaS -dp 4 eager, tail 1000 requests at "
                             "length scale 0.05 (req/s)", 10.7, SIXTEENTH),
}


def bf16_gemm_points() -> list[tuple[int, int, int, float]]:
    """(rows, n, k, seconds) of the bf16 GEMMs timed beside issue 60's FP8 ones."""
    return [(r["rows"], r["n"], r["k"], r["bf16_us"] * 1e-6)
            for path in GEMM_RAWS for r in json.loads(path.read_text())["rows"]]


# the row counts of the timings the profile keeps by shape (a decode step's and the graph
# prefills' of 512 and 1,024 rows); the 2,048- and 4,096-row ones are left to the roofline:
# with them the engine's eager prefill steps of 2,048 and 8,192 tokens cannot both be met by
# one prefill-attention rate (with the 2,048-row timings the 2,048-token step's rate meets its
# fit's floor, 0.35, and the step comes out 4.7% under; with the 4,096-row ones the
# 8,192-token step 17% over), as issue 61's kernels say: prefill attention reaches 0.28 of
# the peak at 2,048 tokens, 0.46 at 32k, which one rate does not
TIMED_ROWS_MAX = 1024
# how the engine ran the rows fitted and validated here: each was measured before session 43
# put a Qwen3's q/k norms inside the RoPE kernel and a MoE router at one row in one launch
# (StepModel's fused_qk_norm and fused_router, on by default as in today's engine)
AS_MEASURED = {"fused_qk_norm": False, "fused_router": False}
# committed runs of `benchmarks/fp8_gemm.py --bf16-only --tp ... --rows ...` (the 8B
# projections and their TP shards), under benchmarks/results/raw/
GEMM_ROW_RUNS = ("*/gemm_tp_shards.json", "**/gemm_rows_512_2048.json")


def tp_shard_points() -> list[tuple[int, int, int, float]]:
    """(rows, n, k, seconds) of the 8B projections and their TP shards where a run of
    `benchmarks/fp8_gemm.py --bf16-only` is committed (GEMM_ROW_RUNS): the shards at 1-256
    rows (raw/s43_profiles/gemm_tp_shards.json), TP 1, 2 and 4 at 512-2,048
    (raw/s43_final_x2/both/gemm_rows_512_2048.json)."""
    paths = sorted({p for pattern in GEMM_ROW_RUNS for p in RAW.glob(pattern)})
    return [(r["rows"], r["n"], r["k"], r["bf16_us"] * 1e-6)
            for path in paths for r in json.loads(path.read_text())["rows"]]


def lone_host() -> tuple[float, float, str]:
    """(lone_host_s, lone_host_token_s, where from) of the H200: a committed run of
    benchmarks/lone_request_host.py (benchmarks/results/raw/*/lone_host.json, the last by
    path where several), measured, not fitted; 0, 0 where none is committed."""
    runs = sorted(RAW.glob("*/lone_host.json"))
    if not runs:
        return 0.0, 0.0, ""
    run = json.loads(runs[-1].read_text())
    return (round(run["lone_host_s"], 9), round(run["lone_host_token_s"], 12),
            f"benchmarks/lone_request_host.py at {run.get('tree', run['commit'])} on one "
            f"{run['device']}, "
            f"benchmarks/results/raw/{runs[-1].parent.name}/lone_host.json: {run['how']}, "
            f"points {run['points']}")


def timed_gemms() -> list[tuple[int, int, int, float]]:
    """(n, k, rows, seconds) of the 8B shape's bf16 projections (and their TP shards where
    timed) at up to TIMED_ROWS_MAX rows, a count timed twice at the mean of its times."""
    times = {}
    for rows, n, k, seconds in bf16_gemm_points() + tp_shard_points():
        if rows <= TIMED_ROWS_MAX:
            times.setdefault((n, k, rows), []).append(seconds)
    return [(*key, round(sum(t) / len(t), 10)) for key, t in sorted(times.items())]


def gemv_line(hbm_bytes_per_s: float) -> tuple[float, float]:
    """(launch, bw_eff) of the GEMMs of 1-4 rows: bound by the weights' bytes, which a GEMV
    only reads (so it streams them faster than the copy that defines the peak)."""
    points = [(2 * (n * k + rows * (n + k)), s) for rows, n, k, s in bf16_gemm_points()
              if rows <= 4]
    return fit.bytes_line(points, hbm_bytes_per_s, reads_only=True)


def moe_flops_eff(matmul_flops: float) -> float:
    """The grouped expert GEMMs' rate at 4,096 tokens (MOE's profile) against the peak."""
    s = load_shape("qwen3-30b-a3b")
    flops = 2.0 * 4096 * s.top_k * 3 * s.hidden * s.expert_intermediate * s.num_layers
    return flops / MOE_GROUPED_4096_S / matmul_flops


def base_compute() -> ComputeProfile:
    launch, bw_eff = gemv_line(4.27e12)
    quick = json.loads(QUICK_RAW.read_text())
    lone_s, lone_token_s, lone_source = lone_host()
    lone_note = {"lone_host_s, lone_host_token_s": lone_source} if lone_source else {}
    return ComputeProfile(
        device="H200", source=f"derived from docs/benchmark_log.md ({GPU_FAST_PATH}; {MOE}; "
        f"{MAX_CONTEXT}; {FOUR_SECOND}) by benchmarks/cost_profiles.py; to be refreshed by "
        "`parashift profile` on an H200",
        hbm_bytes_per_s=4.27e12, matmul_flops=788e12, memory_bytes=150.75e9,
        memory_utilization=0.9, activation_bytes=3.5e9,
        gemm=Roofline(round(bw_eff, 4), 0.8, round(launch, 9)),
        decode_attention=Roofline(0.90, 0.5, round(0.29e-3 / 32 - 4.19e6 / (0.9 * 4.27e12), 7)),
        prefill_attention=Roofline(0.8, 0.5, 10e-6),
        elementwise=Roofline(0.8, 1.0, round(0.34e-3 / 32, 7)),
        moe=Roofline(round(MOE_GROUPED_BW_EFF, 4), round(moe_flops_eff(788e12), 4), 50e-6),
        sampler_s=round(quick["sampler_s"], 9), sampler_row_s=round(quick["sampler_row_s"], 12),
        host_step_s=0.21e-3, eager_launch_s=4e-6,
        kernels_per_layer=14, host_to_device_bytes_per_s=55e9, gemm_timed=timed_gemms(),
        lone_host_s=lone_s, lone_host_token_s=lone_token_s,
        notes={**lone_note,
            "hbm_bytes_per_s, matmul_flops, host_to_device": CEILINGS,
            "memory_bytes": "an H200's 143,771 MiB",
            "gemm.bw_eff, gemm.launch_s": f"{BF16_GEMM}: the line through the 1-4-row "
                                          "GEMMs' seconds by bytes (a GEMV reads its weights "
                                          "at 1.07x the copy rate, plus a fixed cost); "
                                          f"{GPU_FAST_PATH}: batch-1 GEMMs 4.07 ms, as the "
                                          "line gives",
            "gemm_timed": f"{BF16_GEMM}: qkv, o, gate_up and down at 1-{TIMED_ROWS_MAX} "
                          "rows, and their TP shards, from the runs of "
                          "benchmarks/fp8_gemm.py --bf16-only committed under "
                          f"benchmarks/results/raw/ ({', '.join(GEMM_ROW_RUNS)}; the "
                          "4,096-row timings left to the "
                          "roofline: "
                          "benchmarks/cost_profiles.py TIMED_ROWS_MAX); the 8B shape's "
                          "projections are read off these, other shapes off the roofline",
            "moe.bw_eff, moe.flops_eff": f"{MOE}: the grouped expert GEMMs at 64 tokens (181 + "
                                         "95 us against 188 + 94 us of bytes) and at 4,096 "
                                         "tokens (35.5 ms)",
            "decode_attention": f"{GPU_FAST_PATH}: batch 256 attention at 90% of the copy rate; "
                                "batch 1, context 1024: 0.29 ms over 32 layers",
            "elementwise.launch_s": f"{GPU_FAST_PATH}: batch 1 norms, rotary, SiLU, KV write and "
                                    "fill 0.34 ms over 32 layers",
            "sampler_s, sampler_row_s": f"{QUICK}: the sampler timed at 1-256 rows (the "
                                        f"rest of that profile is not adopted); {GPU_FAST_PATH}: "
                                        "sampling 0.03 ms at batch 1",
            "host_step_s": f"{GPU_FAST_PATH}: batch 1 wall 4.91 ms against 4.70 ms of kernels",
            "prefill_attention.bw_eff, elementwise.bw_eff":
                "assumed (no measurement isolates them)",
            "fitted": {k: f"{v[0]} {v[1]} = {v[2]} ({v[3]})" for k, v in FIT_ROWS.items()},
        })


def graph_curve(points):
    return [[b, s] for b, s in points]


def link2() -> LinkProfile:
    ar_graph = [(8 * KiB, 7.2e-6), (16 * KiB, 7.7e-6), (64 * KiB, 8.3e-6), (256 * KiB, 9.4e-6),
                (1 * MiB, 14.5e-6), (8 * MiB, 48.7e-6), (16 * MiB, 16 * MiB / 209e9),
                (256 * MiB, 256 * MiB / 301e9)]
    ar_eager = [(8 * KiB, 40.2e-6), (1 * MiB, 40.4e-6), (8 * MiB, 46.3e-6)] + ar_graph[-2:]
    a2a_graph = [(12 * KiB, 11.5e-6), (96 * KiB, 12.4e-6), (384 * KiB, 13.6e-6),
                 (1.5 * MiB, 18.7e-6), (6 * MiB, 32.0e-6), (24 * MiB, 72.3e-6),
                 (256 * MiB, 0.5 * 256 * MiB / 282e9)]
    a2a_eager = [(12 * KiB, 42.7e-6), (6 * MiB, 44.1e-6), (24 * MiB, 66.2e-6), a2a_graph[-1]]
    copy = [(12 * KiB, 11.5e-6), (1 * MiB, 1 * MiB / 224e9 + 11.5e-6), (1024 * MiB, 1024 * MiB / 224e9)]
    return LinkProfile(
        device="H200", ranks=2, link="nvlink",
        source=f"derived from docs/benchmark_log.md ({COLLECTIVES_2}, third session) and "
               f"{CEILINGS} by benchmarks/cost_profiles.py",
        collectives={"all_reduce": {"graph": graph_curve(ar_graph), "eager": graph_curve(ar_eager)},
                     "all_to_all": {"graph": graph_curve(a2a_graph), "eager": graph_curve(a2a_eager)},
                     "all_gather": {"graph": graph_curve(a2a_graph), "eager": graph_curve(a2a_eager)},
                     "send_recv": {"graph": graph_curve(copy)},
                     "peer_copy": {"graph": graph_curve(copy)}},
        host_to_device_bytes_per_s=55e9, kv_tier_bytes_per_s=31e9,
        notes={"all_reduce": "the one-shot path in graphs to 1 MiB, NCCL beyond; bus bandwidth "
                             "209 GB/s at 16 MiB and 301 GB/s at 256 MiB",
               "all_to_all": "SP's fused q/k/v exchange by bytes per rank; 282 GB/s at 256 MiB",
               "all_gather": "not measured: taken as the all-to-all (same traffic per rank)",
               "send_recv, peer_copy": "224 GB/s GPU-to-GPU copy (one GPU copying; two at "
                                       "once not measured); small-message latency taken as "
                                       "the all-to-all's (not measured)",
               "kv_tier_bytes_per_s": f"{FOUR_FIRST}: Seesaw's 48 GiB of KV out and in over four "
                                      "ranks in 0.82 s of stalls"})


def link4(small_factor: float) -> LinkProfile:
    two = link2()
    scaled = {}
    for name, modes in two.collectives.items():
        scaled[name] = {}
        for mode, curve in modes.items():
            pts = [[b, s * (small_factor if b <= 1 * MiB and name == "all_reduce" else 1.0)]
                   for b, s in curve.points]
            scaled[name][mode] = pts
    for mode in ("graph", "eager"):  # TP4 prefill 8192: 64 all-reduces of 64 MiB in ~22 ms
        scaled["all_reduce"][mode] = [p for p in scaled["all_reduce"][mode] if p[0] < 64 * MiB] + [
            [64 * MiB, 22e-3 / 64], [256 * MiB, 4 * 22e-3 / 64]]
        # SP4 prefill 8192: 64 all-to-alls of ~21 MB per rank in ~5.5 ms
        scaled["all_to_all"][mode] = [p for p in scaled["all_to_all"][mode] if p[0] < 16 * MiB] + [
            [21e6, 5.5e-3 / 64], [256 * MiB, 256 * MiB / 21e6 * 5.5e-3 / 64]]
    scaled["send_recv"] = {"graph": [
        [12 * KiB, 11.5e-6], [1 * MiB, 1 * MiB / 212e9 + 11.5e-6], [1024 * MiB, 1024 * MiB / 212e9]]}
    # every GPU reading the next at once (what a re-shard or a SiDP fetch does): 75.6 GB/s each
    scaled["peer_copy"] = {"graph": [
        [12 * KiB, 11.5e-6], [1 * MiB, 1 * MiB / 75.6e9 + 11.5e-6], [1024 * MiB, 1024 * MiB / 75.6e9]]}
    return replace(two, ranks=4, collectives=scaled,
                   source=f"derived from docs/benchmark_log.md ({COLLECTIVES_2}; {FOUR_FIRST}; "
                          f"{FOUR_SECOND}) by benchmarks/cost_profiles.py; to be refreshed by "
                          "`parashift profile` on four H200s",
                   notes={**two.notes,
                          "all_reduce (4)": f"the two-GPU curve; messages to 1 MiB x{small_factor:.3f} "
                                            f"(fitted to TP4's TPOT, {FOUR_FIRST}); 64 MiB: TP4 "
                                            f"prefill's all-reduces ({FOUR_SECOND})",
                          "all_to_all (4)": f"SP4 prefill 8192's all-to-alls ({FOUR_SECOND})",
                          "send_recv (4)": f"212 GB/s one-stream copy ({FOUR_FIRST})",
                          "peer_copy (4)": f"75.6 GB/s each, every GPU reading the next at "
                                           f"once ({FOUR_FIRST}, SiDP's p2p probe)"})


# ---- fits -----------------------------------------------------------------------------
def _solve(predict, target: float, lo: float, hi: float) -> float:
    """The parameter in [lo, hi] whose prediction meets target (predict monotonic)."""
    rising = predict(hi) > predict(lo)
    for _ in range(60):
        mid = (lo + hi) / 2
        if (predict(mid) < target) == rising:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def fitted() -> tuple[ComputeProfile, LinkProfile, LinkProfile]:
    c = base_compute()
    dense, moe = load_shape("llama-3.1-8b"), load_shape("qwen3-30b-a3b")
    single = Plan()

    def eager(profile, tokens):
        return StepModel(dense, profile, graphs=False).step_s(single, StepBatch.prefill(tokens))
    def with_effs(profile, attention_eff):
        """The GEMM rate that meets the 8192-token row at this attention rate."""
        profile = replace(profile, prefill_attention=replace(profile.prefill_attention,
                                                             flops_eff=attention_eff))
        return replace(profile, gemm=replace(profile.gemm, flops_eff=_solve(
            lambda e: eager(replace(profile, gemm=replace(profile.gemm, flops_eff=e)), 8192),
            227.4e-3, 0.3, 1.0)))
    for _ in range(3):  # the launch fit (512 tokens) barely touches the two rates' rows
        c = with_effs(c, _solve(lambda e: eager(with_effs(c, e), 2048), 49.7e-3, 0.35, 1.0))
        c = replace(c, eager_launch_s=_solve(
            lambda x: eager(replace(c, eager_launch_s=x), 512), 18.1e-3, 1e-7, 1e-4))
        c = replace(c, gemm=replace(c.gemm, overlap=_solve(
            lambda a: ridge_error(replace(c, gemm=replace(c.gemm, overlap=a))),
            0.0, 0.0, 1.0)))
    c = replace(c, moe=replace(c.moe, launch_s=_solve(
        lambda x: StepModel(moe, replace(c, moe=replace(c.moe, launch_s=x)),
                            **AS_MEASURED).step_s(
            single, StepBatch.decode(1, decode_context(1024, 1, 32, 8192))), 4.6e-3, 0.0, 1e-3)))
    moe_eager = _solve(lambda k: StepModel(moe, replace(c, moe_kernels_per_layer=int(round(k))),
                                           graphs=False, **AS_MEASURED).step_s(
                                               single, StepBatch.prefill(512)),
                       92.8e-3, 0.0, 200.0)
    c = replace(c, moe_kernels_per_layer=int(round(moe_eager)))
    per_token = dense.kv_bytes_per_token
    c = replace(c, activation_bytes=c.memory_bytes * c.memory_utilization - dense.weight_bytes
                - 886_048 * per_token)
    c = _rounded(c)
    factor = _solve(lambda f: StepModel(dense, c, link4(f)).step_s(
        Plan(tp=4), StepBatch.decode(1, 2048 + 64)), 2.762e-3, 0.5, 8.0)
    four = link4(round(factor, 4))
    extra = _solve(lambda k: StepModel(dense, replace(c, sp_kernels_per_layer=int(round(k))),
                                       four, graphs=False).step_s(Plan(sp=4), StepBatch.prefill(2048)),
                   38.8e-3, 0.0, 200.0)
    c = replace(fp8_gemm(c), sp_kernels_per_layer=int(round(extra)))
    cas = _solve(lambda k: eager_cas_rate(replace(c, cas_kernels_per_peer=int(round(k))), four),
                 10.7, 0.0, 100.0)
    return replace(c, cas_kernels_per_peer=int(round(cas))), link2(), four


def eager_cas_rate(c: ComputeProfile, four: LinkProfile) -> float:
    """Requests a second of the 70B's eager CaS at d=4 on `tail` (1,000 requests, length
    scale 0.05), as cost/runs.py's offline run predicts them."""
    requests = sample_lengths(get_workload("tail"), 1000,
                              WorkloadOptions(num_requests=1000, length_scale=0.05))
    model = StepModel(load_shape("llama-3.1-70b"), c, four, graphs=False)
    return len(requests) / offline_s(model, Served.sidp(Plan(dp=4), None), requests)


def ridge_steps() -> list[tuple[str, int, float]]:
    """(shape, batch, seconds) of recorded decode steps (context 1024) near the GEMMs'
    ridge whose configuration the validation does not list: the probe's batch 128 of its
    two shapes."""
    probe = json.loads(PROBE_RAW.read_text())["step"]
    return [(Path(shape).stem, 128, row["step_ms"]["128"] * 1e-3) for shape, row in probe.items()]


def ridge_error(c: ComputeProfile) -> float:
    """The mean relative error of `c`'s predictions of the ridge steps (at the mean context
    of the probe's timed steps: 16 after prompts prefilled in steps of 8,192 tokens)."""
    errors = [StepModel(load_shape(shape), c, **AS_MEASURED).step_s(
        Plan(), StepBatch.decode(batch, decode_context(1024, batch, 16, 8192)))
              / seconds - 1 for shape, batch, seconds in ridge_steps()]
    return sum(errors) / len(errors)


def fp8_gemm(c: ComputeProfile) -> ComputeProfile:
    """The FP8 GEMM's roofline from issue 60's timings (the faster of the Triton kernel and
    cuBLASLt a shape and row count): bytes (E4M3 weights, bf16 activations) at up to 64
    rows, FLOPs at 4,096, against the best 4,096-row rate."""
    rows = json.loads(FP8_GEMM_RAW.read_text())["rows"]

    def seconds(r):
        return min(t for t in (r.get("triton_us"), r.get("scaled_mm_us")) if t) * 1e-6
    small = [(r["n"] * r["k"] + 2 * r["rows"] * (r["n"] + r["k"]), seconds(r))
             for r in rows if r["rows"] <= 64]
    large = [(2.0 * r["rows"] * r["n"] * r["k"], seconds(r)) for r in rows if r["rows"] >= 4096]
    peak = max(f / s for f, s in large)
    line = fit.roofline(small, large, c.hbm_bytes_per_s, peak)
    notes = dict(c.notes, fp8_gemm=f"{FP8_GEMM}: fitted by cost/fit.py (bytes at 1-64 rows, "
                 "FLOPs at 4096 rows; fp8_matmul_flops the best 4096-row rate)")
    return replace(c, fp8_gemm=Roofline(round(line.bw_eff, 4), round(line.flops_eff, 4),
                                        round(line.launch_s, 9)),
                   fp8_matmul_flops=float(round(peak, -9)), notes=notes)


def _rounded(c: ComputeProfile) -> ComputeProfile:
    def r(fit):
        return Roofline(round(fit.bw_eff, 4), round(fit.flops_eff, 4), round(fit.launch_s, 9),
                        round(fit.overlap, 4))
    return replace(c, gemm=r(c.gemm), prefill_attention=r(c.prefill_attention), moe=r(c.moe),
                   eager_launch_s=round(c.eager_launch_s, 9),
                   activation_bytes=float(round(c.activation_bytes, -6)))


def write_derived(wanted: dict, check: bool, script: str) -> int:
    """Writes each derived profile of `wanted` (path -> profile), or with `check` says
    which differ from the file (1); a profile `parashift profile` measured is left alone."""
    stale = []
    for path, profile in wanted.items():
        text = json.dumps(to_dict(profile), indent=1) + "\n"
        if path.exists() and not json.loads(path.read_text())["source"].startswith("derived"):
            continue  # `parashift profile` replaced the derivation: leave it
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"stale: {stale}; run python3 benchmarks/{script}", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    compute, two, four = fitted()
    wanted = {OUT / "h200_compute.json": compute, OUT / "h200x2_link.json": two,
              OUT / "h200x4_link.json": four}
    return write_derived(wanted, args.check, "cost_profiles.py")


if __name__ == "__main__":
    sys.exit(main())
