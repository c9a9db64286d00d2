"""Soaks `parashift serve` on the CPU: a mix of completions and chats (streamed or not, n > 1,
structured output), streams the client closes, requests it leaves while they wait, bad
input, and a worker SIGKILLed every few minutes; then checks that every request was
answered, the KV blocks are free, and no process grew, leaked descriptors or threads, or
left a zombie. Prints a report, writes OUT/soak.json and OUT/server.log; exits 1 on a
failed check. `make soak` runs it for 30 minutes (docs/reliability.md, "Soak")."""
import argparse
import sys

from parashift.bench.soak.config import SoakConfig
from parashift.bench.soak.report import render
from parashift.bench.soak.runner import run_soak


def parse(argv: list[str]) -> SoakConfig:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="soak length after the "
                        "warm-up (default 30)")
    parser.add_argument("--warmup-minutes", type=float, default=2.0, help="default 2")
    parser.add_argument("--concurrency", type=int, default=6, help="requests in flight "
                        "(default 6)")
    parser.add_argument("-dp", "--data-parallel-size", type=int, default=2, help="default 2")
    parser.add_argument("-tp", "--tensor-parallel-size", type=int, default=1,
                        help="default 1 (SmolLM2's 9 heads split over 3, not 2: -tp 3 for "
                        "six ranks; -tp 2 with a --model whose heads split in two)")
    parser.add_argument("--kill-every-minutes", type=float, default=3.0,
                        help="a worker SIGKILLed this often; 0: never (default 3)")
    parser.add_argument("--max-kills", type=int, default=None, help="default: as many as fit")
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M")
    parser.add_argument("--seed", type=int, default=0, help="default 0")
    parser.add_argument("--out", default="soak-out", help="report folder (default soak-out)")
    parser.add_argument("--request-timeout", type=float, default=300.0, help="seconds after "
                        "which a request without an answer counts as hung (default 300)")
    parser.add_argument("--serve-arg", action="append", default=[], help="one more argument "
                        "for parashift serve (repeat it: --serve-arg=--max-num-seqs "
                        "--serve-arg=8)")
    args = parser.parse_args(argv)
    return SoakConfig(duration_s=args.minutes * 60, warmup_s=args.warmup_minutes * 60,
                      concurrency=args.concurrency, data_parallel=args.data_parallel_size,
                      tensor_parallel=args.tensor_parallel_size,
                      kill_every_s=args.kill_every_minutes * 60, max_kills=args.max_kills,
                      model=args.model, seed=args.seed, out_dir=args.out,
                      request_timeout_s=args.request_timeout, serve_args=args.serve_arg)


def main(argv: list[str] | None = None) -> int:
    record = run_soak(parse(sys.argv[1:] if argv is None else argv))
    print(render(record))
    return 0 if record["verdict"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
