"""`parashift serve -dp 2` and `-dp 2 -tp 2` on CPU ranks: a worker SIGKILLed with streams
in flight costs its group for a moment (issue 64). Every stream ends with all its tokens;
within 60 s /health is "ok" again with every rank alive, /metrics counts the restart and
its time, and requests afterwards give the tokens they gave before (on every group)."""
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.entrypoints.openai.server_utils import metric_value
from tests.entrypoints.openai.test_fault_isolation import start_streams
from tests.entrypoints.openai.test_lifecycle import cli_server, worker_pids

RECOVERY_S = 60
PROMPTS = [[5, 6, 7], [9, 10, 11, 12], [13, 14], [15, 16, 17, 18, 19], [20, 21, 22]]


def completions(base_url: str) -> list[list]:
    """Each prompt's greedy completion (its tokens' log-probabilities name them), sent
    together so that every group takes some."""
    def complete(prompt):
        return httpx.post(f"{base_url}/v1/completions", timeout=120, json={
            "prompt": prompt, "max_tokens": 8, "ignore_eos": True, "temperature": 0,
            "logprobs": 0})
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        answers = list(pool.map(complete, PROMPTS))
    for answer in answers:
        assert answer.status_code == 200, answer.text
    return [answer.json()["choices"][0]["logprobs"]["tokens"] for answer in answers]


def wait_ok(base_url: str, world: int) -> dict:
    started = time.monotonic()
    while True:
        body = httpx.get(f"{base_url}/health").json()
        if body["status"] == "ok" and body.get("ranks_alive") == world:
            return body
        assert time.monotonic() - started < RECOVERY_S, body
        time.sleep(0.2)


@pytest.mark.parametrize("flags, world, rank", [
    (("-dp", "2"), 2, 1), (("-dp", "2", "-tp", "2"), 4, 0)], ids=["dp2-rank1", "dp2tp2-rank0"])
def test_a_killed_worker_is_replaced_and_serves_again(tmp_path, flags, world, rank):
    with cli_server(tmp_path, *flags, "--num-blocks", "128") as (proc, base_url):
        before = completions(base_url)
        assert all(len(tokens) == 8 for tokens in before)
        workers = sorted(worker_pids(proc))
        assert len(workers) == world
        streams = start_streams(base_url, 6, max_tokens=120)
        os.kill(workers[rank], signal.SIGKILL)
        for stream in streams:
            stream.join(timeout=120)
            assert stream.done and stream.error is None, stream.error
            assert stream.completion_tokens == 120

        body = wait_ok(base_url, world)
        assert body["groups_serving"] == 2 and body["groups_down"] == []
        assert body["worker_restarts"] == 1 and 0 < body["recovery_seconds"] < RECOVERY_S
        assert metric_value(base_url, "parashift_worker_restarts_total") == 1
        assert 0 < metric_value(base_url, "parashift_worker_recovery_seconds") < RECOVERY_S
        assert metric_value(base_url, "parashift_ranks_alive") == world
        assert metric_value(base_url, "parashift_requests_requeued_total") > 0
        assert metric_value(base_url, "parashift_requests_rebalanced_total") == \
            body["requests_rebalanced"]  # (6 streams run at once: none waits to move)
        assert len(worker_pids(proc)) == world
        assert completions(base_url) == before
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        log = proc.stderr.read()
        assert f"worker rank {rank} died (killed by SIGKILL)" in log
        assert "back in service" in log
