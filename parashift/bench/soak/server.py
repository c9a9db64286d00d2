"""The soaked `parashift serve` as a child process: its start, its /health and /metrics,
whether it can heal a lost worker, and its stop."""
import functools
import os
import signal
import socket
import subprocess
import sys
import time

import httpx

from parashift.bench.soak.processes import descendants

RESTART_FLAG = "--max-worker-restarts"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command(port: int, serve_args: list[str]) -> list[str]:
    return [sys.executable, "-m", "parashift.entrypoints.openai", "serve", "--device", "cpu",
            "--host", "127.0.0.1", "--port", str(port), *serve_args]


@functools.lru_cache(maxsize=1)  # asked by the soak and by its test: one `serve --help`
def can_heal() -> bool:
    """True where this parashift restarts lost workers (its serve has --max-worker-restarts)."""
    help_text = subprocess.run([*serve_command(0, []), "--help"], capture_output=True,
                               text=True, timeout=120).stdout
    return RESTART_FLAG in help_text


class Server:
    def __init__(self, serve_args: list[str], log_path: str):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.command = serve_command(self.port, serve_args)
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode} while "
                                   f"starting; see {self.log_path}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the server was not healthy within {timeout_s:.0f} s; "
                           f"see {self.log_path}")

    def health(self) -> tuple[int, dict]:
        try:
            response = httpx.get(f"{self.base_url}/health", timeout=10)
            return response.status_code, response.json()
        except (httpx.HTTPError, ValueError) as exc:
            return 0, {"error": str(exc)}

    def metrics(self) -> dict[str, float]:
        """Every sample without a label other than the model's, by name ({} if unreachable)."""
        from prometheus_client.parser import text_string_to_metric_families
        try:
            text = httpx.get(f"{self.base_url}/metrics", timeout=10).text
        except httpx.HTTPError:
            return {}
        values = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if set(sample.labels) <= {"model_name"}:
                    values[sample.name] = sample.value
        return values

    def stop(self, timeout_s: float = 60) -> dict:
        """SIGTERM, then the exit code and the processes of its tree left behind."""
        tree = descendants(self.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = f"killed after {timeout_s:.0f} s"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in tree):
            time.sleep(0.2)
        left = [p for p in tree if os.path.exists(f"/proc/{p}")]
        for pid in left:  # the harness's own children by pid: none outlives the soak
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.log.close()
        return {"exit_code": code, "processes_left": left}
