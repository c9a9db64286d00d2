"""`parashift serve -dp 3` on CPU ranks: a worker killed mid-stream costs its group only
(issue 21). Its streams go on from another group, /health stays 200 and names the group
down, /metrics counts it; once no group is left the server fails what is outstanding
and exits non-zero."""
import json
import os
import signal
import threading
import time

import httpx
import pytest

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


WHY = {signal.SIGKILL: "worker rank 1 died (killed by SIGKILL)",
       signal.SIGSTOP: "worker rank 1 stopped answering: no heartbeat"}


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "stopped"])
def test_a_lost_worker_costs_its_group_not_the_server(tmp_path, how):
    """A stopped worker is lost too: dead after 1 s of silence, then killed."""
    with cli_server(tmp_path, "-dp", "3", "--num-blocks", "128",
                    "--max-worker-restarts", "0") as (proc, base_url):  # no healing
        ranks = sorted(worker_pids(proc))  # spawned in rank order
        assert len(ranks) == 3
        streams = start_streams(base_url, 9, max_tokens=120)
        os.kill(ranks[1], how)
        for stream in streams:
            stream.join(timeout=120)
            assert stream.done and stream.error is None, stream.error
            assert stream.completion_tokens == 120

        health = httpx.get(f"{base_url}/health")
        assert health.status_code == 200
        body = health.json()
        assert body["status"] == "degraded" and body["groups_serving"] == 2
        (down,) = body["groups_down"]
        assert down["ranks"] == [1] and WHY[how] in down["reason"]
        assert metric_value(base_url, "parashift_ranks_alive") == 2
        assert metric_value(base_url, "parashift_groups_serving") == 2
        assert metric_value(base_url, "parashift_requests_requeued_total") > 0
        after = httpx.post(f"{base_url}/v1/completions", timeout=60,
                           json={"prompt": [5, 6, 7], "max_tokens": 8, "ignore_eos": True})
        assert after.status_code == 200
        assert after.json()["usage"]["completion_tokens"] == 8

        streams = start_streams(base_url, 4, max_tokens=400)
        os.kill(ranks[0], how)
        os.kill(ranks[2], how)
        lost = time.monotonic()
        for stream in streams:
            stream.join(timeout=30)
            assert stream.done and stream.ended_at - lost < 2
            assert stream.error["code"] == "engine_dead"
            assert "no group of the node is left to serve" in stream.error["message"]
        assert proc.wait(timeout=30) == 1
        assert "no group of the node is left to serve" in proc.stderr.read()
