"""The CPU path before and after a change, beside transformers `generate`, for one (dtype,
batch): this tree's engine and a before tree's, each in a child process of its own
(benchmarks/cpu_engine_server.py, the tree first on its PYTHONPATH), and transformers in
this process, all on the CPUs this process may use (run it under `taskset`).

Usage: python3 benchmarks/cpu_ab.py --dtype float32 --batch 16 --before .before
  [--threads 2] [--repeats 3] [--max-repeats 7] [--deadline-s 220] [--profile-tokens 16]
  [--before-llm-args JSON] [--before-env KEY=VALUE ...] [--output cell.json]
As benchmarks/cpu_generate.py: --prompt-len random token ids a prompt, --new-tokens greedy
tokens a request, runs interleaved and rotated each round, medians; at least --repeats
rounds, more (to --max-repeats) while another fits before --deadline-s (seconds from start)
with the profile's reserve. Then, time allowing, torch.profiler's top ops of a
--profile-tokens `generate` of each (after, before, transformers)."""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

from benchmarks.cpu_generate import (load_transformers, new_samples, one_round, prompts_of,
                                     summarize, transformers_run, warm_up)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROFILE_ROWS = 15


class EngineServer:
    """A child process holding one tree's engine (cpu_engine_server.py)."""

    def __init__(self, tree: str, dtype: str, batch: int, threads: int, llm_args: str = "{}",
                 env_vars: tuple[str, ...] = ()):
        env = dict(os.environ, PYTHONPATH=_path_with(tree),
                   **dict(item.split("=", 1) for item in env_vars))
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "cpu_engine_server.py"), "--dtype", dtype,
             "--max-num-seqs", str(batch), "--threads", str(threads), "--llm-args", llm_args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=tree)

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"engine server exited (rc {self.proc.wait()}); see the log")
        return json.loads(line)

    def ask(self, request: dict) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def run(self, prompts, new_tokens: int) -> list[list[int]]:
        return self.ask({"op": "generate", "prompts": prompts, "new_tokens": new_tokens})["tokens"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _path_with(tree: str) -> str:
    """PYTHONPATH with `tree` first and this tree taken out."""
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and os.path.realpath(p) != os.path.realpath(ROOT)]
    return os.pathsep.join([os.path.abspath(tree), *rest])


def profile_transformers(run, prompts, new_tokens: int) -> dict:
    start = time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run(prompts, new_tokens)
    return {"seconds": round(time.perf_counter() - start, 3),
            "table": prof.key_averages().table(sort_by="self_cpu_time_total",
                                               row_limit=PROFILE_ROWS)}


def timed_rounds(runs: dict, prompts, args, started: float) -> tuple[dict, int]:
    """At least --repeats rounds, more while one more and the profile fit the deadline."""
    samples, rounds = new_samples(runs), 0
    while rounds < args.max_repeats:
        round_start = time.perf_counter()
        one_round(runs, prompts, args.new_tokens, rounds, samples)
        rounds += 1
        took = time.perf_counter() - round_start
        reserve = took * 3 * args.profile_tokens / args.new_tokens + 5
        if rounds >= args.repeats and \
                time.perf_counter() - started + took + reserve > args.deadline_s:
            break
    return samples, rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--before", required=True, help="the before tree's root")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-repeats", type=int, default=7)
    parser.add_argument("--deadline-s", type=float, default=220)
    parser.add_argument("--profile-tokens", type=int, default=16)
    parser.add_argument("--before-llm-args", default="{}",
                        help="JSON of more LLM(...) options for the before engine (with "
                        "--before . : this tree against itself under other options)")
    parser.add_argument("--before-env", nargs="*", default=[], metavar="KEY=VALUE",
                        help="environment variables of the before engine only")
    parser.add_argument("--output")
    args = parser.parse_args()
    started = time.perf_counter()
    torch.set_num_threads(args.threads)
    # this tree's engine first and alone: it times its GEMM routes at start-up
    servers = {"after": EngineServer(ROOT, args.dtype, args.batch, args.threads)}
    servers["after"].read()  # ready
    servers["before"] = EngineServer(args.before, args.dtype, args.batch, args.threads,
                                     args.before_llm_args, tuple(args.before_env))
    runs = {"transformers": transformers_run(load_transformers(getattr(torch, args.dtype)))}
    servers["before"].read()
    runs.update({name: server.run for name, server in servers.items()})
    doc = {"dtype": args.dtype, "batch": args.batch, "threads": args.threads,
           "before_llm_args": json.loads(args.before_llm_args), "before_env": args.before_env,
           "cpus": sorted(os.sched_getaffinity(0)), "prompt_len": args.prompt_len,
           "new_tokens": args.new_tokens, "torch": torch.__version__,
           "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "load_seconds": round(time.perf_counter() - started, 1),
           "engines": {n: s.ask({"op": "info"}) for n, s in servers.items()}}
    prompts = prompts_of(args.batch, args.prompt_len)
    warm_up(runs, prompts)
    samples, doc["rounds"] = timed_rounds(runs, prompts, args, started)
    doc["results"] = summarize(samples, args.batch * args.new_tokens)
    print(json.dumps({k: doc[k] for k in ("dtype", "batch", "rounds", "results")}), flush=True)
    profiles = {}
    for name in ("after", "before", "transformers"):
        if time.perf_counter() - started > args.deadline_s - 10:
            break
        profiles[name] = profile_transformers(runs[name], prompts, args.profile_tokens) \
            if name == "transformers" else servers[name].ask(
                {"op": "profile", "prompts": prompts, "new_tokens": args.profile_tokens,
                 "rows": PROFILE_ROWS})
    doc["profiles"], doc["seconds"] = profiles, round(time.perf_counter() - started, 1)
    for server in servers.values():
        server.close()
    if args.output:
        with open(args.output, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
