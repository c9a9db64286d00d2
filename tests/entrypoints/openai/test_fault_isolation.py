"""`parashift serve -dp 3` on CPU ranks: a worker killed or stopped mid-stream costs its
group only (issue 21). Its streams go on from another group, /health stays 200 and names
the group down, /metrics counts it; once no group is left the server fails what is
outstanding and exits non-zero."""
import json
import os
import signal
import threading
import time

import httpx

from tests.entrypoints.openai.server_utils import metric_value
from tests.entrypoints.openai.test_lifecycle import cli_server, worker_pids


class Stream(threading.Thread):
    """One streamed completion, read to its end: its payloads and when it ended."""

    def __init__(self, base_url: str, max_tokens: int, prompt: list[int]):
        super().__init__(daemon=True)
        self.request = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
                        "stream": True, "temperature": 0,
                        "stream_options": {"include_usage": True}}
        self.url = f"{base_url}/v1/completions"
        self.payloads, self.done, self.ended_at = [], False, None
        self.first = threading.Event()

    def run(self) -> None:
        with httpx.stream("POST", self.url, json=self.request, timeout=120) as response:
            for line in response.iter_lines():
                if line == "data: [DONE]":
                    self.done = True
                elif line.startswith("data: "):
                    self.payloads.append(json.loads(line[len("data: "):]))
                    self.first.set()
        self.ended_at = time.monotonic()
        self.first.set()

    @property
    def error(self) -> dict | None:
        return next((p["error"] for p in self.payloads if "error" in p), None)

    @property
    def completion_tokens(self) -> int:
        return self.payloads[-1]["usage"]["completion_tokens"]


def start_streams(base_url: str, count: int, max_tokens: int) -> list[Stream]:
    streams = [Stream(base_url, max_tokens, [1 + i, 2 + i, 3 + i]) for i in range(count)]
    for stream in streams:
        stream.start()
    for stream in streams:
        assert stream.first.wait(timeout=60)
    return streams


WHY = {signal.SIGKILL: "worker rank {} died (killed by SIGKILL)",
       signal.SIGSTOP: "worker rank {} stopped answering: no heartbeat"}


def lose_a_group(base_url: str, ranks: list[int], rank: int, how: signal.Signals,
                 left: int) -> None:
    """`rank`'s worker lost (`how`) under 9 streams: every stream ends with all its tokens,
    /health says degraded naming the rank and why, `left` groups serve and take a request."""
    requeued = metric_value(base_url, "parashift_requests_requeued_total")
    streams = start_streams(base_url, 9, max_tokens=120)
    os.kill(ranks[rank], how)
    for stream in streams:
        stream.join(timeout=120)
        assert stream.done and stream.error is None, stream.error
        assert stream.completion_tokens == 120

    health = httpx.get(f"{base_url}/health")
    assert health.status_code == 200
    body = health.json()
    assert body["status"] == "degraded" and body["groups_serving"] == left
    (down,) = [group for group in body["groups_down"] if group["ranks"] == [rank]]
    assert WHY[how].format(rank) in down["reason"]
    assert metric_value(base_url, "parashift_ranks_alive") == left
    assert metric_value(base_url, "parashift_groups_serving") == left
    assert metric_value(base_url, "parashift_requests_requeued_total") > requeued
    after = httpx.post(f"{base_url}/v1/completions", timeout=60,
                       json={"prompt": [5, 6, 7], "max_tokens": 8, "ignore_eos": True})
    assert after.status_code == 200
    assert after.json()["usage"]["completion_tokens"] == 8


def test_lost_workers_cost_their_groups_not_the_server(tmp_path):
    """A killed worker, then a stopped one (dead after 1 s of silence, then killed), each
    cost their group only; the last group's loss (a stopped worker) ends every stream
    within 2 s and the server."""
    with cli_server(tmp_path, "-dp", "3", "--num-blocks", "128",
                    "--max-worker-restarts", "0") as (proc, base_url):  # no healing
        ranks = sorted(worker_pids(proc))  # spawned in rank order
        assert len(ranks) == 3
        lose_a_group(base_url, ranks, 1, signal.SIGKILL, left=2)
        lose_a_group(base_url, ranks, 0, signal.SIGSTOP, left=1)

        streams = start_streams(base_url, 4, max_tokens=400)
        os.kill(ranks[2], signal.SIGSTOP)
        lost = time.monotonic()
        for stream in streams:
            stream.join(timeout=30)
            assert stream.done and stream.ended_at - lost < 2
            assert stream.error["code"] == "engine_dead"
            assert "no group of the node is left to serve" in stream.error["message"]
        assert proc.wait(timeout=30) == 1
        assert "no group of the node is left to serve" in proc.stderr.read()
