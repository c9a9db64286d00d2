"""The PCIe-like link profiles of two and four H200s (NCCL_P2P_DISABLE=1: NCCL moves every collective,
send and peer copy through host shared memory), derived from the runs of that kind in
docs/benchmark_log.md until `NCCL_P2P_DISABLE=1 parashift profile` measures one.

No collective was timed with peer paths off, so the profile is one number fitted to a whole
run: every NCCL call costs LATENCY_S (assumed) plus its bytes per rank over `bytes_per_s`
(eagerly no less than the NVLink profile's eager launch floor), fitted to the 8B's
`summarize` under TP=2 (its prefills' large all-reduces). The engine's one-shot all-reduce
(up to 4 MiB: every decode's) and the host copies (weights, the CPU KV tier) did not go
through NCCL in those runs and keep the NVLink profile's curve and rates (since session 40
NCCL_P2P_DISABLE=1 turns the one-shot path off: later runs need the NCCL line throughout).
The 8B's `chat`, the 70B's rows and every Seesaw row are held out
(benchmarks/cost_validation.py).

Usage: python3 benchmarks/cost_profiles_pcie.py [--check]   (a profile `parashift profile`
measured, its source not "derived", is left as it is)"""
import argparse
import sys
from dataclasses import replace

from cost_profiles import AS_MEASURED, KiB, MiB, OUT, _solve, link2, write_derived
from parashift.bench.workloads import WorkloadOptions, get_workload, sample_lengths
from parashift.cost.profile import LinkProfile, _ring_share, load
from parashift.cost.runs import Engine, Served, offline_s
from parashift.cost.shape import load_shape
from parashift.cost.step import StepModel
from parashift.parallel.plan import Plan

PATHS = {2: OUT / "h200x2_pcie_link.json", 4: OUT / "h200x4_pcie_link.json"}
SESSION_39 = ("Two H200s for issue 65: Seesaw PCIe-like, SiDP capacity at d=2, self-healing on "
              "GPUs (thirty-ninth session, 2026-11-29)")
# (what is fitted, the run it is fitted to: shape, workload, plan, measured seconds)
FIT_ROWS = {"bytes_per_s": ("llama-3.1-8b", "summarize", "tp2", 14.59)}
# an NCCL call's latency through host memory: assumed, not fitted (these runs move by under
# 1% between 5 and 50 us: the small all-reduces take the one-shot path)
LATENCY_S = 20e-6
ONE_SHOT = 4 * MiB  # parallel/fast_all_reduce.py DEFAULT_MAX_BYTES: symmetric memory, not NCCL
SIZES = (8 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 256 * MiB, 1024 * MiB)


def pcie_link(nvlink: LinkProfile, latency_s: float, bytes_per_s: float) -> LinkProfile:
    """`nvlink` (a committed NVLink profile) with every NCCL path at `latency_s` + a rank's
    traffic over `bytes_per_s` (the rate of two ranks: bytes per rank): all-reduces above
    ONE_SHOT, gathers, all-to-alls, sends and peer copies.
    The engine's one-shot all-reduce reads its peer's memory directly (CUDA peer access,
    which NCCL_P2P_DISABLE leaves on): up to ONE_SHOT it keeps the NVLink curve."""
    eager_floor = nvlink.collectives["all_reduce"]["eager"].points[0][1]
    collectives = {}
    for name, modes in nvlink.collectives.items():
        traffic = _ring_share(name, nvlink.ranks) / _ring_share(name, 2)  # the rate's ranks: 2
        nccl = [[b, latency_s + b * traffic / bytes_per_s] for b in SIZES]
        collectives[name] = {"graph": nccl}
        if "eager" in modes:
            collectives[name]["eager"] = [[b, max(eager_floor, s)] for b, s in nccl]
    collectives["all_reduce"] = {
        mode: [list(p) for p in curve.points if p[0] < ONE_SHOT]
        + [[ONE_SHOT, curve(ONE_SHOT)]] + [p for p in collectives["all_reduce"][mode]
                                           if p[0] > ONE_SHOT]
        for mode, curve in nvlink.collectives["all_reduce"].items()}
    return replace(
        nvlink, link="pcie-like", collectives=collectives,
        source=f"derived from docs/benchmark_log.md ({SESSION_39}) by "
               "benchmarks/cost_profiles_pcie.py: fitted to whole runs, no collective timed; "
               f"to be refreshed by `NCCL_P2P_DISABLE=1 parashift profile` on {nvlink.ranks} "
               "H200s (then take its all_reduce to 4 MiB from the NVLink profile: the engine's "
               "one-shot path)",
        notes={"NCCL (all-reduce above 4 MiB, all-gather, all-to-all, send/recv, peer copy)":
               f"{latency_s * 1e6:.1f} us + bytes per rank at {bytes_per_s / 1e9:.2f} GB/s "
               f"(through host shared memory); eager no less than {eager_floor * 1e6:.1f} us "
               "(the NVLink profile's eager launch)",
               "all-reduce to 4 MiB": "the NVLink profile's: in the runs fitted and held out "
                                      "(sessions 11-40) the engine's one-shot all-reduce over "
                                      "symmetric memory (CUDA peer access) ran with "
                                      "NCCL_P2P_DISABLE=1 too; since session 40 that flag "
                                      "turns it off (parallel/fast_all_reduce.py), so a run "
                                      "after it takes the NCCL line at every size",
               "fit": "; ".join(f"{k}: {v[0]} {v[1]} {v[2]} on two H200s, {v[3]} s measured"
                                for k, v in FIT_ROWS.items())
               + ("" if nvlink.ranks == 2 else f"; at {nvlink.ranks} ranks the same rate "
                  "for each rank's ring traffic (no four-GPU PCIe-like collective measured)"),
               "host_to_device_bytes_per_s, kv_tier_bytes_per_s": "the NVLink profile's "
                                                                  "(host copies, not NCCL)"})


def run_s(link: LinkProfile, row: tuple, requests: int = 128) -> float:
    """A row's offline run (`requests` of its workload at budget 16,384) under `link`."""
    shape, workload, plan, _ = row
    reqs = sample_lengths(get_workload(workload), requests,
                          WorkloadOptions(num_requests=requests))
    model = StepModel(load_shape(shape), load(OUT / "h200_compute.json"), link, **AS_MEASURED)
    return offline_s(model, Served(Plan.parse(plan)), reqs, Engine(max_num_batched_tokens=16384))


def fitted() -> float:
    """The bandwidth that meets its row at LATENCY_S."""
    row = FIT_ROWS["bytes_per_s"]
    rate = _solve(lambda r: run_s(pcie_link(link2(), LATENCY_S, r), row), row[3], 5e9, 200e9)
    return float(round(rate, -7))


def profiles() -> dict:
    """Path -> the PCIe-like profile of two and of four H200s, at the rate fitted on two."""
    rate = fitted()
    return {PATHS[2]: pcie_link(link2(), LATENCY_S, rate),
            PATHS[4]: pcie_link(load(OUT / "h200x4_link.json"), LATENCY_S, rate)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    return write_derived(profiles(), args.check, "cost_profiles_pcie.py")


if __name__ == "__main__":
    sys.exit(main())
