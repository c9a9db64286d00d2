"""Two "hosts" on one machine: two `parashift serve` processes with --nnodes 2, their
ranks meeting over TCP with gloo; node 1's ranks driven over the TCP control channel."""
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.distributed.test_fault_isolation import PARAMS, reference, requests  # noqa: F401
from tests.engine.conftest import save_tiny_llama
from tests.entrypoints.openai.server_utils import wait_until


def _ephemeral_low() -> int:
    """The lowest port the OS hands out to outgoing connections (other test lanes'
    clients take their local ports from there, between our probe and the node's bind)."""
    with contextlib.suppress(OSError, ValueError):
        return int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    return 32768


def _port_triple() -> int:
    """A port below the ephemeral range whose next two are free too (the rendezvous, the
    control channel and HTTP)."""
    for _ in range(200):
        port = random.randrange(10000, _ephemeral_low() - 2)
        with contextlib.ExitStack() as probes:
            with contextlib.suppress(OSError):
                for candidate in (port, port + 1, port + 2):
                    sock = probes.enter_context(socket.socket())
                    sock.bind(("", candidate))
                return port
    raise RuntimeError("no three consecutive free ports")


def _serve(node_rank: int, master_port: int, http_port: int, flags, log) -> subprocess.Popen:
    """A node's `parashift serve`, its stderr to `log` (a pipe left unread would fill and
    block it)."""
    command = [sys.executable, "-m", "parashift.entrypoints.openai", "serve", "--device", "cpu",
               "--dtype", "float32", "--nnodes", "2", "--node-rank", str(node_rank),
               "--master-port", str(master_port), "--port", str(http_port), *flags]
    return subprocess.Popen(command, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"})


@contextlib.contextmanager
def two_nodes(tmp_path, *flags):
    """Node 1 first (it waits for node 0), then node 0; yields both processes (a list:
    `nodes.restart_node_1()` starts node 1 again in it), node 0's URL once it is healthy,
    and each node's stderr file. A start that lost a port to another process between the
    probe and the bind starts again on other ports."""
    logs = [tmp_path / f"node{i}.log" for i in range(2)]
    for attempt in range(3):
        master_port = _port_triple()
        nodes, url, files = _start_both(master_port, master_port + 2, flags, logs)
        try:
            _wait_healthy(nodes, url, logs)
            break
        except _PortTaken:
            _stop(nodes, files)
            if attempt == 2:
                raise
    try:
        yield nodes, url, logs
    finally:
        _stop(nodes, files)


class _PortTaken(AssertionError):
    pass


def _start_both(master_port: int, http_port: int, flags, logs):
    files = [open(log, "w") for log in logs]
    nodes = _Nodes([None, _serve(1, master_port, http_port, flags, files[1])])
    nodes[0] = _serve(0, master_port, http_port, flags, files[0])
    nodes.restart_node_1 = lambda: nodes.__setitem__(
        1, _serve(1, master_port, http_port, flags, files[1]))
    return nodes, f"http://127.0.0.1:{http_port}", files


def _wait_healthy(nodes, url: str, logs) -> None:
    def healthy():
        for node, log in zip(nodes, logs):
            if node.poll() is not None:
                text = log.read_text()
                taken = "Address already in use" in text
                raise (_PortTaken if taken else AssertionError)(f"a node exited: {text}")
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{url}/health").status_code == 200
    assert wait_until(healthy, timeout=240, interval=0.2)


def _stop(nodes, files) -> None:
    for node in nodes:
        if node.poll() is None:
            node.kill()
            node.wait()
    for file in files:
        file.close()


class _Nodes(list):
    restart_node_1 = None


def _seconds_until_unhealthy(url: str, limit: float = 10.0) -> float:
    """Until /health answers other than 200, or no longer answers (the server exits)."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code != 200:
                break
        except httpx.HTTPError:
            break
        time.sleep(0.05)
    return time.monotonic() - started


def test_pp2_across_two_nodes_tp2_inside_each_matches_one_device(
        tiny_llama_dir, requests, reference, tmp_path):  # noqa: F811
    """The tiny Llama (4 heads, 2 layers): stage 0 on node 0's ranks 0-1, stage 1 on node
    1's ranks 2-3, each request's tokens as on one device; then node 1's process is killed:
    node 0 sees it within 2 s (no group is left, so /health turns 503 and the server exits
    non-zero)."""
    with two_nodes(tmp_path, "--model", tiny_llama_dir, "-pp", "2", "-tp", "2",
                   "--skip-tokenizer-init", "--num-blocks", "64") as (nodes, url, logs):
        chosen = slice(0, 4)

        def tokens(prompt):
            return _greedy_tokens(url, prompt, PARAMS.max_tokens, ignore_eos=True)
        with ThreadPoolExecutor(4) as pool:  # together: both stages run batches
            got = list(pool.map(tokens, requests[chosen]))
        assert got == [[f"token_id:{token}" for token in want] for want in reference[chosen]]
        nodes[1].send_signal(signal.SIGKILL)
        assert _seconds_until_unhealthy(url) < 2.0
        assert nodes[0].wait(timeout=30) == 1
        assert "node 1 lost" in logs[0].read_text()


def test_a_lost_worker_or_node_is_seen_and_comes_back(tmp_path):
    """DP=2 over two nodes (a replica each): node 1's worker killed is replaced through its
    agent; node 1's process killed: within 2 s /health says degraded, naming the lost node,
    and node 0's replica serves on with the tokens it gave before; node 1 started again:
    its rank rejoins (a new rendezvous generation) and /health is "ok" with both ranks;
    both groups give the tokens they gave before."""
    from tests.entrypoints.openai.test_lifecycle import worker_pids
    model = save_tiny_llama(tmp_path / "tiny")
    with two_nodes(tmp_path, "--model", model, "-dp", "2", "--skip-tokenizer-init",
                   "--num-blocks", "64") as (nodes, url, logs):
        before = _completions_on_both(url)
        (worker,) = worker_pids(nodes[1])
        os.kill(worker, signal.SIGKILL)
        _wait_recovered(url, restarts=1)
        assert _completions_on_both(url) == before

        alone = _greedy_tokens(url, [1, 2, 3])
        nodes[1].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        assert wait_until(lambda: httpx.get(f"{url}/health").json()["status"] == "degraded",
                          timeout=2.0, interval=0.05), "node 1's loss not seen within 2 s"
        assert time.monotonic() - killed < 2.0
        nodes[1].wait()
        health = httpx.get(f"{url}/health").json()
        assert health["groups_serving"] == 1 and health["ranks_alive"] == 1
        assert "node 1 lost" in health["groups_down"][0]["reason"]
        assert _greedy_tokens(url, [1, 2, 3]) == alone
        time.sleep(max(0.0, 2 - (time.monotonic() - killed)))  # node 0 waits for the host,
        assert httpx.get(f"{url}/health").json()["worker_restarts"] == 1  # counting no attempt
        nodes.restart_node_1()
        _wait_recovered(url, restarts=2)
        assert _completions_on_both(url) == before
        log = logs[0].read_text()
        assert "node 1 lost" in log and "node 1 is back" in log


def _greedy_tokens(url: str, prompt: list[int], max_tokens: int = 8,
                   ignore_eos: bool = False) -> list:
    """A greedy completion's tokens (its log-probabilities name them)."""
    response = httpx.post(f"{url}/v1/completions", timeout=120, json={
        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": 0,
        "ignore_eos": ignore_eos})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["logprobs"]["tokens"]


def _completions_on_both(url: str) -> list:
    """Greedy completions of a few prompts sent together (both groups take some)."""
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda prompt: _greedy_tokens(url, prompt),
                             [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10, 11]]))


def _wait_recovered(url: str, restarts: int) -> None:
    def ok():
        body = httpx.get(f"{url}/health").json()
        return body["status"] == "ok" and body.get("worker_restarts") == restarts
    assert wait_until(ok, timeout=60, interval=0.2), httpx.get(f"{url}/health").json()
    assert httpx.get(f"{url}/health").json()["ranks_alive"] == 2
