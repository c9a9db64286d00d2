"""What a load balancer or a Kubernetes probe reads: liveness, readiness and load.

- `/health` (liveness): 200 while the engine runs ("ok", or "degraded" with the groups
  lost), 503 once it is dead (restart the process); always with the server's load.
- `/ready` (readiness): 200 while new requests are welcome; 503 "draining" from the first
  SIGTERM for `--drain-delay` seconds (the server still serves everything sent to it, so
  a balancer or Kubernetes' endpoints can stop routing here before the listener closes),
  503 "overloaded" while the queue is at `--max-num-queued-requests`, 503 once the engine
  is dead.
- the load, on both: requests in flight and requests waiting for a step, for least-load
  balancing (envoy's LEAST_REQUEST sees only its own connections; this is the engine's)."""
import logging
import threading

logger = logging.getLogger(__name__)


class Readiness:
    """Whether the server is draining (set once, by the first SIGTERM)."""

    def __init__(self):
        self.draining = threading.Event()

    def start_draining(self, delay_s: float, then) -> None:
        """Marks the server draining, then calls `then()` (the real shutdown) after
        `delay_s`."""
        self.draining.set()
        logger.warning("draining: /ready answers 503 for %g s, then the server shuts down",
                       delay_s)
        timer = threading.Timer(delay_s, then)
        timer.daemon = True
        timer.start()


def server_load(async_engine) -> dict:
    return {"requests": async_engine.num_streams, "waiting": async_engine.num_waiting}


def not_ready_reason(async_engine, readiness: Readiness) -> tuple[str, str] | None:
    """(code, message) of why new requests should go elsewhere; None when ready."""
    if not async_engine.is_running:
        return "engine_dead", str(async_engine.dead_error or "the engine is not running")
    if readiness.draining.is_set():
        return "draining", "the server is shutting down: send new requests elsewhere"
    limit = async_engine.max_num_queued_requests
    if limit is not None and async_engine.num_waiting >= limit:
        return "overloaded", f"{async_engine.num_waiting} requests wait (the limit is {limit})"
    return None
