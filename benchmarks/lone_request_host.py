"""A lone request's host work on this machine: `parashift profile`'s lone-request probe
(planner/measure_host.py `lone_host`) alone, without the kernel sweeps. Lone prompts of a
2-layer model (mixed-step graphs on CUDA), one token each, timed from admission to output
as benchmarks/prefill_throughput.py times a prompt, less the step's device time as the
committed H200 profile predicts it; fitted per request and per prompt token.
benchmarks/cost_profiles.py reads a committed run (benchmarks/results/raw/*/lone_host.json)
into the H200 profile's lone_host_s and lone_host_token_s.

Usage (GPU): PYTHONPATH=. python3 benchmarks/lone_request_host.py --output FILE [--repeats 7]"""
import argparse
import json
from pathlib import Path

import torch

from parashift.cost.measure import current_commit
from parashift.cost.profile import load
from parashift.planner import measure_host

PROFILE = Path(__file__).resolve().parent / "results" / "profiles" / "h200_compute.json"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True)
    parser.add_argument("--device", default=None, help="default: cuda where present")
    parser.add_argument("--repeats", type=int, default=measure_host.LONE_REPEATS)
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    measure_host.LONE_REPEATS = args.repeats
    (per_request, per_token), notes = measure_host.lone_host(load(PROFILE), device)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    result = dict(device=name, commit=current_commit(), lone_host_s=per_request,
                  lone_host_token_s=per_token, repeats=args.repeats, **notes)
    Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
