"""The executors: how the engine's steps reach the ranks (base.py says what it asks of one)."""
from parashift.executor.base import Executor, WorkerFailure


def make_executor(config, hf_config, source, layout, plans, device, dtype,
                  max_model_len: int) -> Executor:
    """The executor of `layout`: the one device in this process, else a process (or a Ray
    actor: `distributed_executor_backend`) per rank, each of which also makes the plans of
    `plans` (the policy's) that the layout does not run. (Imported here, not above: each
    executor imports base.py of this package, and one device needs no worker process.)"""
    if layout.world_size == 1:
        from parashift.executor.uniproc import UniprocExecutor
        return UniprocExecutor(config, hf_config, source, device, dtype, max_model_len)
    from parashift.executor.multiproc import MultiprocExecutor
    from parashift.executor.ray_executor import RayExecutor
    from parashift.models.moe import check_plan
    from parashift.worker.worker import WorkerSpec
    for plan in plans:
        check_plan(plan, hf_config, config.moe_parallel)
    others = tuple(p for p in plans if p not in layout.plans)
    spec = WorkerSpec(config, hf_config, source, layout, device.type, dtype, max_model_len,
                      master_port=0, other_plans=others)
    kind = RayExecutor if config.distributed_executor_backend == "ray" else MultiprocExecutor
    return kind(spec, config.worker_timeout_s, config.worker_heartbeat_timeout_s,
                config.worker_step_timeout_s)


__all__ = ["Executor", "WorkerFailure", "make_executor"]
