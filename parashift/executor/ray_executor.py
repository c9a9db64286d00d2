"""`--distributed-executor-backend ray`: the multi-process executor with every rank a Ray
actor (ray_ranks.py), driven over TCP as another host's ranks are."""
from parashift.executor.base import WorkerFailure
from parashift.executor.multiproc import MultiprocExecutor
from parashift.executor.ray_ranks import RayRanks, start_ray_ranks


class RayExecutor(MultiprocExecutor):
    def _start_ranks(self, ctx, spec) -> list[RayRanks]:
        try:
            ray_ranks, conns = start_ray_ranks(spec, self.timeout_s)
        except (TimeoutError, OSError, ValueError) as e:
            self.failure = WorkerFailure(f"the Ray ranks did not start: {e}")
            raise self.failure from e
        self.procs = [ray_ranks.ranks[rank] for rank in range(self.layout.world_size)]
        self.conns = [conns[rank] for rank in range(self.layout.world_size)]
        return [ray_ranks]
