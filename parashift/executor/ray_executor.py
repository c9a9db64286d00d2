"""`--distributed-executor-backend ray`: the multi-process executor with every rank a Ray
actor (ray_ranks.py), driven over TCP as another host's ranks are; a lost rank's
replacement is a new actor on its bundle (ray_replacement.py)."""
from parashift.executor.base import WorkerFailure
from parashift.executor.multiproc import MultiprocExecutor
from parashift.executor.ray_ranks import RayRanks, start_ray_ranks
from parashift.executor.ray_replacement import RayHosts


class RayExecutor(MultiprocExecutor):
    def __init__(self, spec, *args, **kwargs):
        super().__init__(spec, *args, **kwargs)
        self.hosts = RayHosts(self.links[0])

    def _start_ranks(self, ctx, spec) -> list[RayRanks]:
        try:
            ray_ranks, conns = start_ray_ranks(spec, self.timeout_s)
        except (TimeoutError, OSError, ValueError) as e:
            self.failure = WorkerFailure(f"the Ray ranks did not start: {e}")
            raise self.failure from e
        self.procs = [ray_ranks.ranks[rank] for rank in range(self.layout.world_size)]
        self.conns = [conns[rank] for rank in range(self.layout.world_size)]
        return [ray_ranks]
