"""Runs the app under uvicorn: in the foreground (the CLI) or in a thread
(tests, notebooks).

On SIGTERM or Ctrl-C uvicorn stops accepting connections and lets in-flight
requests finish for `shutdown_timeout` seconds; then the app ends those still
running (an error event and `[DONE]` for a stream, a JSON 503 otherwise: see
shutdown.py), and uvicorn runs the app's lifespan end, which stops the engine
thread. uvicorn's own timeout, which cancels request tasks, is a backstop
`SHUTDOWN_GRACE_S` later."""
import socket
import threading
import time

import uvicorn

from parashift.entrypoints.openai.server_config import ServerConfig
from parashift.entrypoints.openai.shutdown import DrainingServer

SHUTDOWN_GRACE_S = 5.0


def uvicorn_config(app, config: ServerConfig, **overrides) -> uvicorn.Config:
    return uvicorn.Config(app, **uvicorn_options(config, **overrides))


def uvicorn_options(config: ServerConfig, **overrides) -> dict:
    """uvicorn.Config's keywords for `config` (vLLM's server flags among them)."""
    options = dict(host=config.host, port=config.port,
                   log_level=config.uvicorn_log_level or config.log_level,
                   access_log=config.access_log, lifespan="on",
                   timeout_graceful_shutdown=config.shutdown_timeout + SHUTDOWN_GRACE_S,
                   root_path=config.root_path, uds=config.uds,
                   ssl_keyfile=config.ssl_keyfile, ssl_certfile=config.ssl_certfile,
                   ssl_ca_certs=config.ssl_ca_certs, ssl_cert_reqs=config.ssl_cert_reqs)
    if config.log_config_file is not None:
        options["log_config"] = config.log_config_file
    if config.ssl_ciphers is not None:
        options["ssl_ciphers"] = config.ssl_ciphers
    return {**options, **overrides}


def make_server(app, config: ServerConfig, **overrides) -> DrainingServer:
    """A uvicorn server that starts the app's shutdown deadline when it shuts down."""
    deadline = getattr(app.state, "shutdown_deadline", None)
    return DrainingServer(uvicorn_config(app, config, **overrides), deadline,
                          getattr(app.state, "readiness", None), config.drain_delay)


def run_server(app, config: ServerConfig) -> None:
    """Serves until SIGTERM/SIGINT, or until the engine dies (as vLLM's server: a
    supervisor restarts a process that exits, not one that answers 503 forever), then
    drains and returns; the caller exits non-zero if the engine died."""
    server = make_server(app, config)
    engine = getattr(app.state, "async_engine", None)
    if engine is not None:
        engine.on_death(lambda: setattr(server, "should_exit", True))
    server.run()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class ServerThread:
    """`with ServerThread(app, config) as server:` serves on `server.base_url`."""

    def __init__(self, app, config: ServerConfig, startup_timeout: float = 60.0):
        port = config.port or free_port(config.host)
        self.base_url = f"http://{config.host}:{port}"
        self.app = app
        self._server = make_server(app, config, port=port)
        self._thread = threading.Thread(target=self._server.run, name="parashift-http",
                                        daemon=True)
        self._startup_timeout = startup_timeout

    def __enter__(self) -> "ServerThread":
        self._thread.start()
        deadline = time.monotonic() + self._startup_timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def signal(self, sig: int) -> None:
        """What the server does when the process gets `sig` (SIGTERM: drain, then stop)."""
        self._server.handle_exit(sig, None)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 30.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)
