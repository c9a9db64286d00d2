"""One embedded-model engine per test process, and servers around it.

Loading the embedded SmolLM2 takes a while on a CPU, so every server test
(here and in tests/bench) wraps the same `LLMEngine`. Only one server may use it
at a time; each server's shutdown leaves it with no requests."""
import contextlib
import functools
import time

import httpx

from parashift.config import EngineConfig
from parashift.engine.llm_engine import LLMEngine
from parashift.entrypoints.openai.api_server import build_app
from parashift.entrypoints.openai.launcher import ServerThread
from parashift.entrypoints.openai.server_config import ServerConfig

MAX_MODEL_LEN = 512
MAX_NUM_SEQS = 4


def server_engine(**options) -> LLMEngine:
    """An engine with the shared one's options (the embedded SmolLM2 unless `model`)."""
    return LLMEngine(EngineConfig(**{**dict(device="cpu", dtype="float32", seed=0,
                                            max_model_len=MAX_MODEL_LEN, num_blocks=256,
                                            max_num_seqs=MAX_NUM_SEQS), **options}))


@functools.lru_cache(maxsize=None)
def shared_engine() -> LLMEngine:
    return server_engine()


@contextlib.contextmanager
def running_server(engine=None, **server_options):
    """Serves `engine` (default: the shared one) on a free loopback port."""
    engine = engine or shared_engine()
    config = ServerConfig(port=0, log_level="warning", **server_options)
    app = build_app(engine, config)
    with ServerThread(app, config) as server:
        yield server
    assert not engine.has_unfinished_requests(), "the server left requests in the engine"


def wait_until(predicate, timeout: float = 20.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def wait_engine_idle(server, timeout: float = 20.0) -> bool:
    """True once the engine holds no request and every KV block is free."""
    engine = server.app.state.async_engine.engine

    def idle():
        stats = engine.stats()
        return (not engine.has_unfinished_requests()
                and stats.num_free_blocks == stats.num_total_blocks)
    return wait_until(idle, timeout)


def metric_value(base_url: str, name: str, **labels) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    from prometheus_client.parser import text_string_to_metric_families
    text = httpx.get(f"{base_url}/metrics").text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total
