"""`--distributed-executor-backend ray`: the ranks as Ray actors on a local Ray head that
this test starts, driven over the same TCP control channel as another host's ranks."""
import os
import time

import pytest

from parashift import LLM, SamplingParams
from parashift.executor.multiproc import WorkerFailure
from tests.distributed.conftest import MAX_TOKENS, PROMPTS

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'parashift[ray]'")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def ray_head():
    """A local head with a CPU per rank; its workers import this checkout's parashift."""
    try:
        ray.init(num_cpus=6, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": ROOT}})
    except Exception as e:  # noqa: BLE001 (whatever stops Ray here is the reason to skip)
        pytest.skip(f"a local Ray head cannot start here: {e}")
    yield
    ray.shutdown()


def test_pp2_tp3_as_ray_actors_matches_one_device(ray_head, smollm2_reference):
    llm = LLM(device="cpu", dtype="float32", generation_config="vllm",
              max_num_batched_tokens=32, pipeline_parallel_size=2, tensor_parallel_size=3,
              distributed_executor_backend="ray")
    engine = llm.llm_engine
    try:
        outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
        assert [out.outputs[0].text for out in outputs] == smollm2_reference
        ray_ranks = engine.executor.links[0]
        ray.kill(ray_ranks.actors[4])  # a rank of stage 1: the one group is lost
        started = time.monotonic()
        with pytest.raises(WorkerFailure, match="rank 4 died .*Ray actor"):
            while time.monotonic() - started < 10:
                engine.check_health()
                time.sleep(0.05)
        assert time.monotonic() - started < 2.0
    finally:
        engine.shutdown()
