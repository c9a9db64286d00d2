"""`parashift profile`: measure this machine's profiles."""
from pathlib import Path

from parashift.cost.profile import save
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


def run_profile(args) -> None:
    import time

    import torch

    from parashift.cost.measure import Sweep, current_commit, measure_compute
    from parashift.planner.measure_host import measure_host
    started = time.perf_counter()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    commit = current_commit()
    compute = measure_compute(device, commit, quick=args.quick)
    compute = measure_host(compute, device, Sweep.for_device(device, args.quick).host_batches)
    save(compute, args.output)
    print(f"compute profile of {compute.device} -> {args.output} "
          f"({time.perf_counter() - started:.0f} s)")
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    if gpus < 2:
        print("one device: the link profile is left as committed "
              f"({', '.join(p.name for p in sorted(PROFILES.glob('*_link.json')))})")
        return
    from parashift.cost.measure_link import measure_link
    out = args.link_output or str(Path(args.output).with_suffix("")) + "_link.json"
    save(measure_link(commit), out)
    print(f"link profile of {gpus} GPUs -> {out}")

