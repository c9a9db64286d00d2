"""Kills a worker every so often (SIGKILL) and times the server's recovery. Where the server
cannot heal, a kill is made only while it leaves a group serving (the last group's loss
ends the server, by design), and the rest are recorded as skipped."""
import asyncio
import os
import random
import signal
import time
from dataclasses import asdict, dataclass

from parashift.bench.soak.processes import sample_tree, worker_pids
from parashift.bench.soak.server import Server

RESTARTS = "parashift_worker_restarts_total"


@dataclass
class Kill:
    at_s: float                      # since the soak began
    pid: int | None
    worker: int | None               # its place among the workers alive, oldest first
    skipped: str = ""                # why no worker was killed
    groups_before: float | None = None
    groups_after: float | None = None
    recovered_s: float | None = None  # healing: until /health said "ok" with every rank
    not_recovered: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


class Killer:
    def __init__(self, server: Server, every_s: float, limit: int, heal: bool,
                 recover_timeout_s: float, seed: int, t0: float):
        self.server, self.every_s, self.limit, self.heal = server, every_s, limit, heal
        self.recover_timeout_s = recover_timeout_s
        self.rng = random.Random(seed)
        self.t0 = t0
        self.kills: list[Kill] = []
        self.world: int | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """A kill every `every_s` until `stop` or `limit` kills (the first after `every_s`)."""
        self.world = (await asyncio.to_thread(self.server.metrics)).get("parashift_ranks_alive")
        while sum(kill.pid is not None for kill in self.kills) < self.limit:
            try:
                await asyncio.wait_for(stop.wait(), self.every_s)
                return
            except asyncio.TimeoutError:
                pass
            self.kills.append(await asyncio.to_thread(self.kill_one))

    def kill_one(self) -> Kill:
        at = round(time.monotonic() - self.t0, 1)
        groups = self.server.metrics().get("parashift_groups_serving")
        workers = worker_pids(sample_tree(self.server.pid))
        if not workers:
            return Kill(at, None, None, skipped="no worker alive", groups_before=groups)
        if not self.heal and (groups or 0) <= 1:
            return Kill(at, None, None, skipped="the server cannot heal and one group is "
                        "left: killing it would end the server", groups_before=groups)
        index = self.rng.randrange(len(workers))
        os.kill(workers[index], signal.SIGKILL)
        kill = Kill(at, workers[index], index, groups_before=groups)
        if self.heal:
            self._wait_recovered(kill)
        else:
            time.sleep(5)  # the group's loss is seen within 2 s
        kill.groups_after = self.server.metrics().get("parashift_groups_serving")
        return kill

    def _wait_recovered(self, kill: Kill) -> None:
        """Back once /health said "ok" with every rank alive after the loss was seen (a
        degraded answer, fewer ranks, or one more restart counted)."""
        killed_at = time.monotonic()
        restarts = self.server.metrics().get(RESTARTS, 0.0)
        seen_down, last = False, None
        while time.monotonic() - killed_at < self.recover_timeout_s:
            code, body = self.server.health()
            metrics = self.server.metrics() if code == 200 else {}
            alive = metrics.get("parashift_ranks_alive")
            healthy = code == 200 and body.get("status") == "ok" and alive == self.world
            seen_down = seen_down or not healthy or metrics.get(RESTARTS, 0.0) > restarts
            if healthy and seen_down:
                kill.recovered_s = round(time.monotonic() - killed_at, 2)
                return
            last = (code, body)
            time.sleep(0.25)
        kill.not_recovered = f"not back within {self.recover_timeout_s:.0f} s: /health {last}"
