"""A worker SIGKILLed under load (issue 65 part 5): an offline workload's requests (`chat`,
400, all sent at once) streamed through the engine as `parashift serve` runs it (its core in
a process of its own where the server's would be; real worker processes), one rank killed
mid-run (by default once a quarter of the output tokens came); then how each request ended
(completed, failed with its error, or neither), the seconds until the engine saw the loss
and until every group served again, the longest wait between streamed tokens of requests
on the groups that survived, and output tokens/s before, during and after the recovery
(parashift/bench/recovery.py). Once the engine says
every group serves, one probe request is sent: the router gives it the idle, replaced group;
the group's first output (the probe's first token, or that of a request of its share of the
waiting queue, which moves to it at once and goes before the probe) is when it served
again. One JSON report (--output) and a summary.

    python benchmarks/recovery_under_load.py --device cpu -dp 2 --num-requests 16 \\
        --length-scale 0.05 --kill-rank 1 --kill-after-tokens 100        # embedded SmolLM2
    python benchmarks/recovery_under_load.py --model benchmarks/shapes/llama-3.1-8b.json \\
        -dp 2 --kill-rank 0 --output kill_rank0.json"""
import argparse
import asyncio
import json
import os
import signal
import threading
import time
from collections import Counter

from parashift.bench.prompts import fill_token_prompts
from parashift.bench.recovery import FaultSample, Trace, analyse, loss_seen, serving_again
from parashift.bench.workloads import WORKLOADS, WorkloadOptions, build_phases, get_workload
from parashift.engine.async_engine import AsyncLLMEngine
from parashift.engine.core_client import make_engine
from parashift.entrypoints.engine_args import add_engine_args, engine_config_from_args
from parashift.sampling_params import SamplingParams

PROBE_ID, PROBE_PROMPT_TOKENS, PROBE_TOKENS = "probe", 16, 64


class FaultWatcher:
    """Samples the engine's fault report from a thread of its own, each change timed."""

    def __init__(self, engine, interval_s: float = 0.002):
        self.engine, self.interval_s = engine, interval_s
        self.samples: list[FaultSample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-watcher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last = None
        while not self._stop.is_set():
            faults = self.engine.faults  # a new report on every change (frozen)
            if faults is not last:
                self.samples.append(FaultSample(time.monotonic(), faults.ranks_alive,
                                                tuple(g.ranks for g in faults.groups_down)))
                last = faults
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def placement(engine) -> dict[str, tuple[int, ...]]:
    return engine.placement()  # an engine core in a process of its own is asked


def kill_rank(engine, rank: int) -> tuple[float, int, dict]:
    """Run on the engine thread between steps: where each request is, then the kill."""
    where = placement(engine)
    pids = engine.worker_pids()
    if rank >= len(pids) or pids[rank] is None:
        raise RuntimeError(f"rank {rank} has no worker process on this host: {pids}")
    pid = pids[rank]
    os.kill(pid, signal.SIGKILL)
    return time.monotonic(), pid, where


async def stream(aengine: AsyncLLMEngine, trace: Trace, prompt: list[int],
                 progress: list[int], slots: asyncio.Semaphore) -> None:
    params = SamplingParams(temperature=0, max_tokens=trace.max_tokens, ignore_eos=True)
    finish = None
    try:
        async with slots:
            async for output in aengine.generate(trace.request_id, prompt, params):
                count, finish = len(output.outputs[0].token_ids), output.outputs[0].finish_reason
                if count > trace.num_tokens:
                    progress[0] += count - trace.num_tokens
                    trace.token_times.append((time.monotonic(), count))
    except Exception as exc:  # noqa: BLE001 - the request's outcome, reported
        trace.status, trace.error = "failed", f"{type(exc).__name__}: {exc}"[:500]
        return
    if finish == "error":
        trace.status, trace.error = "failed", "finish reason error"
    else:
        trace.status = "completed" if trace.num_tokens == trace.max_tokens else "short"


async def kill_when_due(aengine, args, progress: list[int], sent_at: float, total: int):
    tokens = args.kill_after_tokens
    if tokens is None and args.kill_after is None:
        tokens = int(total * args.kill_at_share)
    while not ((tokens is not None and progress[0] >= tokens) or
               (args.kill_after is not None and time.monotonic() - sent_at >= args.kill_after)):
        await asyncio.sleep(0.005)
    return await aengine.call(lambda engine: kill_rank(engine, args.kill_rank))


async def probe(aengine, watcher: FaultWatcher, killed: asyncio.Future, world: int,
                vocab_size: int) -> dict:
    """Once every group serves again: the requests each group holds (by its ranks), then one
    request more; when its first token came and where, and the requests each group held
    then (the returned group's share of the queue moved to it meanwhile)."""
    kill_at = (await killed)[0]
    while serving_again(watcher.samples, loss_seen(watcher.samples, kill_at), world) is None:
        await asyncio.sleep(0.005)
    groups = Counter(",".join(map(str, ranks)) for ranks in
                     (await aengine.call(placement)).values())
    sent = time.monotonic()
    prompt = [(7 * i + 11) % vocab_size for i in range(PROBE_PROMPT_TOKENS)]
    params = SamplingParams(temperature=0, max_tokens=PROBE_TOKENS, ignore_eos=True)
    result = {"requests_by_group_when_back": dict(groups), "sent_s": round(sent - kill_at, 3)}
    try:
        async for _ in aengine.generate(PROBE_ID, prompt, params):
            if "first_token_s" not in result:
                result["first_token_s"] = round(time.monotonic() - kill_at, 3)
                where = await aengine.call(placement)
                ranks = where.get(PROBE_ID)
                result["ranks"] = None if ranks is None else list(ranks)
                result["requests_by_group_at_first_token"] = dict(Counter(
                    ",".join(map(str, r)) for r in where.values()))
                result["placement_at_first_token"] = where
    except Exception as exc:  # noqa: BLE001 - reported with the rest
        result["error"] = f"{type(exc).__name__}: {exc}"[:500]
    return result


async def drive(aengine, engine, args, requests) -> dict:
    traces = [Trace(f"req-{r.index}", r.output_len) for r in requests]
    world = engine.faults.ranks_alive
    watcher, progress = FaultWatcher(engine), [0]
    sent_at = time.monotonic()
    slots = asyncio.Semaphore(args.max_concurrency or len(requests))
    tasks = [asyncio.create_task(stream(aengine, t, r.prompt, progress, slots))
             for t, r in zip(traces, requests)]
    killer = asyncio.create_task(kill_when_due(aengine, args, progress, sent_at,
                                               sum(t.max_tokens for t in traces)))
    prober = asyncio.create_task(probe(aengine, watcher, killer, world, engine.vocab_size))
    _, pending = await asyncio.wait(tasks, timeout=args.timeout_s)
    for trace, task in zip(traces, tasks):
        if task in pending:
            trace.status, trace.error = "hung", f"not ended within {args.timeout_s:g} s"
            task.cancel()
    if not killer.done():
        killer.cancel()
        prober.cancel()
        watcher.stop()
        raise SystemExit("every request ended before the kill: kill earlier (--kill-after "
                         "or --kill-after-tokens)")
    kill_at, pid, where = killer.result()
    try:
        probed = await asyncio.wait_for(prober, args.recovery_wait_s)
    except asyncio.TimeoutError:
        probed = {"error": f"not every group served again within {args.recovery_wait_s:.0f} s "
                           "after the requests ended"}
    watcher.stop()
    after = probed.pop("placement_at_first_token", {})
    for trace in traces:
        trace.ranks = where.get(trace.request_id)
        trace.ranks_after = after.get(trace.request_id)
    report = analyse(traces, watcher.samples, kill_at, args.kill_rank, world, sent_at,
                     args.window_s)
    faults = engine.faults
    return {**report, "killed_pid": pid, "world_size": world, "probe": probed,
            "replaced_serving_s": first_of(probed.get("first_token_s"),
                                           report["returned_group_first_output_s"]),
            "engine_faults": faults.as_json(), "elapsed_s": round(time.monotonic() - sent_at, 3)}


async def run(args) -> dict:
    engine = make_engine(engine_config_from_args(args))  # as the server: its core apart on GPUs
    try:
        options = WorkloadOptions(seed=args.seed or 0, num_requests=args.num_requests,
                                  length_scale=args.length_scale)
        requests = build_phases(get_workload(args.workload), options)[0].requests
        fill_token_prompts(requests, options.seed, engine.vocab_size)
        aengine = AsyncLLMEngine(engine)
        aengine.start()
        try:
            report = await drive(aengine, engine, args, requests)
        finally:
            await aengine.shutdown()
    finally:
        engine.shutdown()
    setup = {"model": args.model, "dp": args.data_parallel_size,
             "tp": args.tensor_parallel_size, "workload": args.workload,
             "num_requests": len(requests), "max_concurrency": args.max_concurrency,
             "length_scale": args.length_scale,
             "kill_rank": args.kill_rank, "kill_after_s": args.kill_after,
             "kill_after_tokens": args.kill_after_tokens, "kill_at_share": args.kill_at_share}
    return {"setup": setup, **report}


def first_of(*seconds: float | None) -> float | None:
    """The replaced group's first output: the probe's first token, or one of its share of
    the queue (moved to it once back, older than the probe: they go first)."""
    return min((s for s in seconds if s is not None), default=None)


def summary(report: dict) -> str:
    r, tp = report["requests"], report["throughput"]

    def rate(part):
        return "-" if part is None else f"{part['output_tokens_per_s']} tok/s ({part['seconds']} s)"
    lines = [
        f"requests: {r['completed']} completed, {r['failed']} failed, {r['other']} other "
        f"({report['requests_on_lost_group']} on the lost group, "
        f"{report['requests_on_lost_group_completed']} of them completed; "
        f"{report['engine_faults']['requests_requeued']} re-queued)",
        f"kill rank {report['killed_rank']} at {report['kill_at_s']} s: loss seen after "
        f"{report['detection_s']} s (ranks {report['lost_ranks']}), every group serving after "
        f"{report['serving_again_s']} s, the replaced group's first output after "
        f"{report['replaced_serving_s']} s (the probe's {report['probe'].get('first_token_s')} s)"
        f"; requests by group then "
        f"{report['probe'].get('requests_by_group_when_back')}, at the probe's first token "
        f"{report['probe'].get('requests_by_group_at_first_token')} "
        f"({report['engine_faults'].get('requests_rebalanced')} moved to the returned group)",
        f"surviving groups' longest stall {report['survivors_longest_stall_s']} s "
        f"(longest gap before the kill {report['survivors_longest_gap_before_s']} s, after "
        f"{report['survivors_longest_gap_after_s']} s); "
        f"the lost group's requests' longest gap {report['lost_group_longest_gap_s']} s",
        f"throughput before {rate(tp['before'])}, during {rate(tp['during'])}, "
        f"after {rate(tp['after'])}"]
    lines += [f"failed {f['request']}: {f['error']}" for f in r["failures"][:5]]
    return "\n".join(lines)


def headline(report: dict) -> dict:
    """The figures of the issue's row, for a one-line JSON in a log."""
    r, windows = report["requests"], report["throughput"]
    return {"dp": report["setup"]["dp"], "tp": report["setup"]["tp"],
            "kill_rank": report["killed_rank"], "completed": r["completed"],
            "failed": r["failed"], "other": r["other"], "detection_s": report["detection_s"],
            "serving_again_s": report["serving_again_s"],
            "replaced_serving_s": report["replaced_serving_s"],
            "stall_s": report["survivors_longest_stall_s"],
            "tok_s": [None if windows[k] is None else windows[k]["output_tokens_per_s"]
                      for k in ("before", "during", "after")]}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(p)
    g = p.add_argument_group("load and kill")
    g.add_argument("--workload", default="chat",
                   choices=[name for name, w in WORKLOADS.items() if w.offline])
    g.add_argument("--num-requests", type=int, default=400)
    g.add_argument("--length-scale", type=float, default=1.0,
                   help="multiply the workload's lengths (e.g. 0.05 on a CPU)")
    g.add_argument("--max-concurrency", type=int, default=None,
                   help="requests in flight at most: each that ends lets the next go (default: "
                        "all sent at once)")
    g.add_argument("--kill-rank", type=int, default=1)
    g.add_argument("--kill-after", type=float, default=None,
                   help="seconds after the requests were sent")
    g.add_argument("--kill-after-tokens", type=int, default=None,
                   help="once this many output tokens were streamed")
    g.add_argument("--kill-at-share", type=float, default=0.25,
                   help="without --kill-after(-tokens): once this share of the workload's "
                        "output tokens were streamed")
    g.add_argument("--window-s", type=float, default=None,
                   help="the throughput windows before and after (default: kill time)")
    g.add_argument("--timeout-s", type=float, default=600,
                   help="requests not ended by then are reported hung")
    g.add_argument("--recovery-wait-s", type=float, default=120,
                   help="how long to wait, once the requests ended, for every group to "
                        "serve again (for the probe)")
    g.add_argument("--output", default=None, help="the JSON report")
    args = p.parse_args(argv)
    world = args.data_parallel_size * args.tensor_parallel_size * args.pipeline_parallel_size
    if not 0 <= args.kill_rank < world:
        p.error(f"--kill-rank {args.kill_rank} is not a rank of the {world} ranks")
    if not 0 <= args.kill_at_share < 1:
        p.error(f"--kill-at-share must be in [0, 1), got {args.kill_at_share}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    report = asyncio.run(run(args))
    print(summary(report), flush=True)
    print(json.dumps(headline(report)), flush=True)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
