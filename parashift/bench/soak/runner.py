"""One soak: the server started, a warm-up of the traffic mix, the baseline, the soak
itself (traffic, kills, the process tree sampled), then the server left idle and checked."""
import asyncio
import json
import os
import random
import time

import httpx

from parashift.bench.soak.client import perform
from parashift.bench.soak.config import SoakConfig
from parashift.bench.soak.killer import Killer
from parashift.bench.soak.leaks import Slots, compare, zombies
from parashift.bench.soak.outcomes import Outcome
from parashift.bench.soak.processes import sample_tree
from parashift.bench.soak.requests import MIX, draw
from parashift.bench.soak.server import Server, can_heal
from parashift.bench.soak.verdict import judge

PROBE = {"prompt": "probe", "max_tokens": 1}
BLOCK_TOKENS = 16  # the engine's default block size


async def fill_kv_pools(base_url: str, config: SoakConfig, rng: random.Random) -> int:
    """Writes every KV block of every group once: long prompts of distinct random token
    ids (no prefix in common), a group's pool over in all (blocks are handed out oldest
    freed first). Returns the requests sent; each must succeed."""
    if not (config.num_blocks and config.max_model_len):
        return 0
    length = config.max_model_len - 8
    per_group = -(-config.num_blocks * BLOCK_TOKENS // length)
    count = (per_group + 1) * config.data_parallel  # routing need not split them evenly
    async with httpx.AsyncClient(base_url=base_url, timeout=config.request_timeout_s) as client:
        async def one() -> None:
            prompt = [rng.randrange(100, 40000) for _ in range(length)]
            response = await client.post("/v1/completions",
                                         json={"prompt": prompt, "max_tokens": 1})
            response.raise_for_status()
        for start in range(0, count, config.concurrency):
            await asyncio.gather(*(one() for _ in range(min(config.concurrency,
                                                           count - start))))
    return count


async def drive(base_url: str, config: SoakConfig, rng: random.Random, seconds: float,
                t0: float, outcomes: list[Outcome]) -> None:
    """`concurrency` lanes, each sending one request of the mix after the other."""
    until = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=4 * config.concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(None),
                                 limits=limits) as client:
        async def lane(lane_rng: random.Random) -> None:
            while time.monotonic() < until:
                outcomes.append(await perform(client, draw(lane_rng), config.request_timeout_s,
                                              t0))
        await asyncio.gather(*(lane(random.Random(rng.random()))
                               for _ in range(config.concurrency)))


async def one_of_each(base_url: str, config: SoakConfig, rng: random.Random, t0: float,
                      outcomes: list[Outcome]) -> None:
    """A request of every kind of the mix, one after the other: what a kind starts on first
    use (the grammar compile threads) is up before the baseline, however slow the machine
    (a timed warm-up alone may not reach every kind)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(None)) as client:
        for _, make in MIX.values():
            outcomes.append(await perform(client, make(rng), config.request_timeout_s, t0))


async def sample_while(server: Server, slots: Slots, every_s: float, stop: asyncio.Event,
                       series: list, events: list, t0: float) -> None:
    """The process tree every `every_s`: each slot's figures, replacements, zombies."""
    while not stop.is_set():
        tree = await asyncio.to_thread(sample_tree, server.pid)
        at = round(time.monotonic() - t0, 1)
        events.extend({"at_s": at, "event": change} for change in slots.follow(tree))
        series.append({"at_s": at, "zombies": zombies(tree),
                       "slots": {name: [tree[s.pid].rss_kib, tree[s.pid].fds,
                                        tree[s.pid].threads] if s.pid in tree else None
                                 for name, s in slots.slots.items()}})
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except asyncio.TimeoutError:
            pass


def settle(server: Server, timeout_s: float = 180) -> dict:
    """Waits for no request running or waiting, sends one 1-token probe (so the gauges
    are those of a step after everything ended), and returns /metrics."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        metrics = server.metrics()
        if not metrics.get("parashift_num_requests_running", 1) \
                and not metrics.get("parashift_num_requests_waiting", 1):
            break
        time.sleep(1)
    probe = httpx.post(f"{server.base_url}/v1/completions", json=PROBE, timeout=120)
    time.sleep(2)  # the probe's connection closed on both ends
    return {**server.metrics(), "probe_status": probe.status_code}


def quiet_tree(server: Server, tries: int = 5) -> dict:
    """The process tree once the harness's own last connections are closed on the server's
    side too: two samples a second apart with the same descriptor counts."""
    counts = lambda tree: {pid: (p.fds, p.threads) for pid, p in tree.items()}
    time.sleep(1)
    tree = sample_tree(server.pid)
    for _ in range(tries):
        time.sleep(1)
        again = sample_tree(server.pid)
        if counts(again) == counts(tree):
            break
        tree = again
    return again


async def soak_phase(server: Server, config: SoakConfig, heal: bool, slots: Slots,
                     rng: random.Random, t0: float, record: dict) -> None:
    stop = asyncio.Event()
    killer = Killer(server, config.kill_every_s or 1.0, config.planned_kills, heal,
                    config.recover_timeout_s, config.seed, t0)
    sampler = asyncio.create_task(sample_while(server, slots, config.sample_every_s, stop,
                                               record["series"], record["events"], t0))
    kills = asyncio.create_task(killer.run(stop))
    await drive(server.base_url, config, rng, config.duration_s, t0, record["outcomes"])
    stop.set()
    await asyncio.gather(sampler, kills)
    record["kills"] = [kill.as_dict() for kill in killer.kills]


def run_soak(config: SoakConfig) -> dict:
    """Runs the soak and returns its report (also written to out_dir/soak.json)."""
    os.makedirs(config.out_dir, exist_ok=True)
    heal = can_heal()
    server = Server(config.serve_flags(heal), os.path.join(config.out_dir, "server.log"))
    record = {"config": config.as_dict(), "command": server.command, "heal": heal,
              "outcomes": [], "series": [], "events": [], "kills": []}
    phases = record["phases"] = {}
    started = time.monotonic()
    mark = lambda name: phases.__setitem__(name, round(time.monotonic() - started, 1))
    try:
        server.wait_healthy(config.start_timeout_s)
        mark("started")
        t0, rng = time.monotonic(), random.Random(config.seed)
        record["kv_fill_requests"] = asyncio.run(fill_kv_pools(server.base_url, config, rng))
        mark("kv_filled")
        asyncio.run(one_of_each(server.base_url, config, rng, t0, record["outcomes"]))
        asyncio.run(drive(server.base_url, config, rng, config.warmup_s, t0,
                          record["outcomes"]))
        record["warmup_requests"] = len(record["outcomes"])
        record["metrics_baseline"] = settle(server)
        baseline = quiet_tree(server)
        slots = Slots(baseline)
        mark("warmed_up")
        asyncio.run(soak_phase(server, config, heal, slots, rng, t0, record))
        mark("soaked")
        record["metrics_final"] = settle(server)
        record["health_final"] = server.health()
        final = quiet_tree(server)
        record["events"].extend({"at_s": round(time.monotonic() - t0, 1), "event": change}
                                for change in slots.follow(final))
        record["leaks"] = [row.as_dict() for row in compare(slots, baseline, final,
                                                            config.rss_tolerance)]
        record["zombies_final"] = zombies(final)
        mark("checked")
    except Exception as exc:  # reported as the failed check "soak ran to its end"
        record["aborted"] = f"{type(exc).__name__}: {exc}"
    finally:
        record["stop"] = server.stop()
        mark("stopped")
    record["outcomes"] = [outcome.as_dict() for outcome in record["outcomes"]]
    with open(server.log_path, errors="replace") as log:
        record["tracebacks_in_log"] = log.read().count("Traceback (most recent call last)")
    record["verdict"] = judge(record)
    with open(os.path.join(config.out_dir, "soak.json"), "w") as out:
        json.dump(record, out, indent=1)
    return record
