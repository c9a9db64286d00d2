"""`--distributed-executor-backend ray`: the ranks as Ray actors on a local Ray head that
this test starts, driven over the same TCP control channel as another host's ranks; a
lost rank comes back as a new actor on its bundle (issue 64)."""
import os
import signal
import time

import pytest

from parashift import LLM
from parashift.executor.multiproc import WorkerFailure
from tests.distributed.test_fault_isolation import (
    COMMON, PARAMS, add_all, assert_as_on_one_device, reference, requests,  # noqa: F401
    run_to_the_end, step_until_decoding)
from tests.distributed.test_self_healing import (
    HEALING, assert_serves_on_every_group, wait_recovered)

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'parashift[ray]'")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def ray_head():
    """A local head with a CPU per rank of the largest world here (4); its workers import this
    checkout's parashift. Ray starts an idle worker per CPU, so no more CPUs than needed."""
    try:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": ROOT}})
    except Exception as e:  # noqa: BLE001 (whatever stops Ray here is the reason to skip)
        pytest.skip(f"a local Ray head cannot start here: {e}")
    yield
    ray.shutdown()


def test_pp2_tp2_as_ray_actors_matches_one_device(ray_head, tiny_llama_dir, requests,  # noqa: F811
                                                  reference):  # noqa: F811
    """The tiny Llama (4 heads, 2 layers) over four Ray actors, a stage per pair: each
    request's tokens equal one device's; one actor killed, the rank is lost within 2 s."""
    llm = LLM(tiny_llama_dir, pipeline_parallel_size=2, tensor_parallel_size=2,
              distributed_executor_backend="ray", **COMMON)
    engine = llm.llm_engine
    try:
        chosen = slice(0, 8)
        outputs = llm.generate(requests[chosen], PARAMS)
        assert [out.outputs[0].token_ids for out in outputs] == reference[chosen]
        ray_ranks = engine.executor.links[0]
        ray.kill(ray_ranks.actors[3])  # a rank of stage 1: the one group is lost
        started = time.monotonic()
        with pytest.raises(WorkerFailure, match="rank 3 died .*Ray actor"):
            while time.monotonic() - started < 10:
                engine.check_health()
                time.sleep(0.05)
        assert time.monotonic() - started < 2.0
    finally:
        engine.shutdown()


def actor_process(actor) -> tuple[int, str]:
    """The pid and node id of a Ray actor's process (from Ray's actor table)."""
    from ray._private.state import actors
    info = actors(actor_id=actor._actor_id.hex())
    return info["Pid"], info["Address"]["NodeID"]


def test_a_killed_actor_is_replaced_on_its_bundle(ray_head, tiny_llama_dir, requests,  # noqa: F811
                                                  reference):  # noqa: F811
    """-dp 2 under Ray: rank 1's actor process SIGKILLed mid-decode. Every request ends as
    on one device, a new actor on the lost one's bundle (its node) rejoins at a new
    rendezvous, and requests afterwards run on both groups with one device's tokens."""
    llm = LLM(tiny_llama_dir, data_parallel_size=2, distributed_executor_backend="ray",
              **HEALING)
    engine = llm.llm_engine
    try:
        ray_ranks = engine.executor.links[0]
        lost = ray_ranks.actors[1]
        pid, node = actor_process(lost)
        ids = add_all(engine, requests, prefix="ray-")
        finished: dict = {}
        step_until_decoding(engine, finished)
        os.kill(pid, signal.SIGKILL)
        run_to_the_end(engine, finished)
        assert_as_on_one_device(finished, ids, reference)
        wait_recovered(engine, world=2, timeout=180)
        faults = engine.faults
        assert (faults.ranks_alive, faults.groups_serving, faults.worker_restarts) == (2, 2, 1)
        new_pid, new_node = actor_process(ray_ranks.actors[1])
        assert ray_ranks.actors[1] is not lost and new_pid != pid and new_node == node
        assert engine.executor.procs[1].is_alive() and engine.executor.procs[1].generation == 1
        assert_serves_on_every_group(engine, requests, reference)
    finally:
        llm.shutdown()
