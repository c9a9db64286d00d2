"""What the kernel microbenchmarks of a model shape share: their command line (--model, an
integer list such as --tokens, --output) and the rows they print and save."""
import argparse
import json
from typing import Callable

import torch


def run(doc: str, counts: str, default: list[int], measure: Callable[[dict, int], list[dict]],
        extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """Parses the command line, prints each row of measure(model config, count) for each
    count of --<counts> as a JSON line, and writes them all to --output if given."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--model", default="benchmarks/shapes/qwen3-30b-a3b.json")
    p.add_argument(f"--{counts}", type=int, nargs="+", default=default)
    p.add_argument("--output", default=None)
    if extra is not None:
        extra(p)
    args = p.parse_args()
    cfg = json.load(open(args.model))
    rows = []
    for count in getattr(args, counts):
        for row in measure(cfg, count, args):
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"model": args.model, "device": torch.cuda.get_device_name(),
                       "rows": rows}, f, indent=1)
    return args
