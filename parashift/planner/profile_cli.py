"""`parashift profile`: measure this machine's profiles."""
from dataclasses import replace
from pathlib import Path

from parashift.cost.advisor import DEVICE_KINDS
from parashift.cost.profile import ROOFLINES, ComputeProfile, load, save
from parashift.cost.shape import SHAPES

PROFILES = SHAPES.parent / "results" / "profiles"


def add_profile_args(subparsers) -> None:
    p = subparsers.add_parser(
        "profile", help="measure this machine's compute profile (and its GPUs' link profile)",
        description="Time the kernels of one device and, with two or more local GPUs, the "
                    "collectives between them; write them as cost-model profiles.")
    p.add_argument("--output", required=True, help="the compute profile's JSON file")
    p.add_argument("--link-output", default=None,
                   help="the link profile's JSON file (default: OUTPUT with _link before .json)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--quick", action="store_true",
                   help="fewer sizes (a few minutes on a GPU instead of several)")
    p.set_defaults(func=run_profile)


UNTIMED = ("activation_bytes", "kernels_per_layer", "sp_kernels_per_layer",
           "tp_kernels_per_layer")


def with_untimed(c: ComputeProfile) -> ComputeProfile:
    """What `parashift profile` does not time (fitted to logged runs) carried over from the
    committed profile of this device kind, where there is one."""
    kinds = [word for word in DEVICE_KINDS if word in c.device.lower()]
    path = PROFILES / f"{DEVICE_KINDS[kinds[0]]}_compute.json" if kinds else None
    if path is None or not path.is_file():
        return c
    committed = load(path)
    notes = dict(c.notes, carried_over=f"{', '.join(UNTIMED)} from {path.name} ("
                 f"{committed.source.split(' by ')[0]})")
    return replace(c, notes=notes, **{name: getattr(committed, name) for name in UNTIMED})


def summary(c: ComputeProfile) -> str:
    """The fits, one line each (what a reader checks first)."""
    lines = [f"copy {c.hbm_bytes_per_s / 1e9:.0f} GB/s, matrix {c.matmul_flops / 1e12:.1f} "
             f"TFLOP/s, host to device {c.host_to_device_bytes_per_s / 1e9:.1f} GB/s"]
    for name in ROOFLINES + ("fp8_gemm",):
        fit = getattr(c, name)
        if fit is not None:
            lines.append(f"{name:<18} bw_eff {fit.bw_eff:.3f} flops_eff {fit.flops_eff:.3f} "
                         f"fixed {fit.launch_s * 1e6:.1f} us")
    lines.append(f"sampler {c.sampler_s * 1e6:.1f} us + {c.sampler_row_s * 1e9:.1f} ns a row; "
                 f"host {c.host_step_s * 1e6:.1f} us a step + {c.host_seq_s * 1e6:.2f} us a "
                 f"sequence; eager launch {c.eager_launch_s * 1e6:.1f} us; a lone request "
                 f"{c.lone_host_s * 1e6:.1f} us + {c.lone_host_token_s * 1e9:.1f} ns a token")
    return "\n".join(lines)


def run_profile(args) -> None:
    import time

    import torch

    from parashift.cost.measure import Sweep, current_commit, measure_compute
    from parashift.planner.measure_host import measure_host
    started = time.perf_counter()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    commit = current_commit()
    compute = measure_compute(device, commit, quick=args.quick)
    try:
        compute = measure_host(compute, device, Sweep.for_device(device, args.quick).host_batches)
    except Exception as e:  # noqa: BLE001  the kernels' profile stands; say what is missing
        compute = replace(compute, notes=dict(compute.notes, host=f"not measured: "
                                              f"{type(e).__name__}: {e}"))
    compute = with_untimed(compute)
    save(compute, args.output)
    print(f"compute profile of {compute.device} -> {args.output} "
          f"({time.perf_counter() - started:.0f} s)")
    print(summary(compute))
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    if gpus < 2:
        print("one device: the link profile is left as committed "
              f"({', '.join(p.name for p in sorted(PROFILES.glob('*_link.json')))})")
        return
    from parashift.cost.measure_link import measure_link
    out = args.link_output or str(Path(args.output).with_suffix("")) + "_link.json"
    save(measure_link(commit), out)
    print(f"link profile of {gpus} GPUs -> {out}")

