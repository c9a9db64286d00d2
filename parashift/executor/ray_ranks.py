"""`--distributed-executor-backend ray`: every rank a Ray actor on a running Ray cluster
(`ray start --head`, `ray start --address ...` on the others; without one, Ray starts a
local instance).

A placement group reserves one bundle per rank (a GPU each, a CPU each on the CPU),
packed host by host; ranks are numbered in bundle order grouped by host, the engine's
host first, so TP groups land inside a host as with torchrun-style launches. Each actor
opens a TCP connection to the engine and serves steps on it exactly as a remote worker
does (node_link.py): the executor drives Ray ranks through the same `RemoteRank`s and
messages. An actor that dies ends its rank (its run call fails, its connection closes).
A lost rank's replacement is a new actor on the same bundle (`restart`: ray_replacement.py)."""
import logging
import socket
import threading
import time

from parashift.executor.node_link import RemoteRank, accept_ranks, connect

logger = logging.getLogger(__name__)


def ray_module():
    try:
        import ray
    except ImportError:
        raise ImportError("--distributed-executor-backend ray needs Ray: "
                          "pip install 'parashift[ray]'") from None
    return ray


class RankActor:
    """One rank's process (made a Ray actor class by `RayRanks`)."""

    def run(self, rank: int, spec, address) -> int:
        from parashift.worker.worker import worker_main
        heartbeats = [0.0] * spec.layout.world_size  # beaten locally; Ray watches the actor
        worker_main(rank, spec, connect(address, ("rank", rank)), heartbeats)
        return 0


class RayRanks:
    """The ranks' actors and their placement group; `ranks` maps each rank to the
    RemoteRank the executor watches."""

    def __init__(self, world_size: int, device_type: str, topology, timeout_s: float):
        ray = self.ray = ray_module()
        from ray.util.placement_group import placement_group, placement_group_table
        ray.init(ignore_reinit_error=True, log_to_driver=False)
        resource = {"GPU": 1} if device_type == "cuda" else {"CPU": 1}
        self.group = placement_group([resource] * world_size, strategy="PACK")
        if not ray.get(self.group.ready(), timeout=timeout_s):
            raise TimeoutError(f"Ray could not place {world_size} bundles of {resource}")
        order = _bundles_by_host(placement_group_table(self.group)["bundles_to_node_id"],
                                 ray.get_runtime_context().get_node_id())
        _check_hosts(order, topology)
        self.actor_class, self.resource = ray.remote(RankActor), resource
        self.bundles = [bundle for bundle, _ in order]  # by rank
        self.actors = [self._new_actor(bundle) for bundle in self.bundles]
        self.ranks = {rank: RemoteRank(rank, host, self)
                      for rank, (_, host) in enumerate(_host_numbers(order))}
        self.address: tuple[str, int] | None = None  # the engine's port the actors connect to

    def _new_actor(self, bundle: int):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        return self.actor_class.options(
            num_cpus=self.resource.get("CPU", 0), num_gpus=self.resource.get("GPU", 0),
            scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, bundle)).remote()

    def start(self, spec, address) -> None:
        """Starts every rank's worker; a thread ends a rank once its run call ends."""
        self.address = address
        self._watch({actor.run.remote(rank, spec, address): self.ranks[rank]
                     for rank, actor in enumerate(self.actors)})

    def restart(self, rank: int, spec) -> RemoteRank:
        """A new actor for lost `rank` on its bundle (so its node), running a worker from
        `spec` (a replacement's generation); it connects to `address` as at start-up."""
        self.actors[rank] = self._new_actor(self.bundles[rank])
        remote = self.ranks[rank] = RemoteRank(rank, self.ranks[rank].node, self,
                                               spec.generation)
        self._watch({self.actors[rank].run.remote(rank, spec, self.address): remote})
        return remote

    def _watch(self, runs: dict) -> None:
        """A thread ends each rank of `runs` (run call -> its RemoteRank) once its call ends
        (an older actor's call ending later ends only its own RemoteRank)."""
        threading.Thread(target=self._wait_runs, args=(runs,), daemon=True,
                         name="parashift-ray-ranks").start()

    def _wait_runs(self, runs: dict) -> None:
        pending = list(runs)
        while pending:
            done, pending = self.ray.wait(pending, num_returns=1)
            try:
                runs[done[0]].end(self.ray.get(done[0]))
            except Exception as e:  # the actor died (killed, its node lost) or its run failed
                runs[done[0]].end(-9, f"its Ray actor ended: {str(e).splitlines()[0]}")

    def send(self, message) -> None:
        kind, argument = message
        if kind == "kill":
            self.ray.kill(self.actors[argument])
        elif kind == "shutdown":
            self.shutdown(argument)

    def shutdown(self, grace_s: float) -> None:
        deadline = time.monotonic() + grace_s
        for remote in self.ranks.values():
            remote.join(max(0.0, deadline - time.monotonic()))
        for actor in self.actors:
            self.ray.kill(actor)
        self.ray.util.remove_placement_group(self.group)


def start_ray_ranks(spec, timeout_s: float) -> tuple[RayRanks, dict]:
    """Every rank of `spec`'s layout started as a Ray actor and connected; the actors and
    each rank's step connection. The spec's rendezvous store is the engine's (on its
    master port): the actors reach it at this node's address."""
    world, ray_ranks = spec.layout.world_size, None
    try:
        ray_ranks = RayRanks(world, spec.device_type, spec.config.topology, timeout_s)
        spec.master_addr = ray_ranks.ray.util.get_node_ip_address()
        with socket.socket() as sock:  # a free port for the actors' connections
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        ray_ranks.start(spec, (ray_ranks.ray.util.get_node_ip_address(), port))
        _, conns = accept_ranks(("", port), set(range(world)), timeout_s)
    except BaseException:
        if ray_ranks is not None:
            ray_ranks.shutdown(grace_s=0)
        raise
    return ray_ranks, conns


def _bundles_by_host(bundle_nodes: dict, first_node: str) -> list[tuple[int, str]]:
    """(bundle index, node id) in rank order: the engine's node first, then by node."""
    return sorted(bundle_nodes.items(), key=lambda item: (item[1] != first_node, item[1],
                                                          item[0]))


def _host_numbers(order: list[tuple[int, str]]) -> list[tuple[int, int]]:
    hosts = list(dict.fromkeys(node for _, node in order))
    return [(bundle, hosts.index(node)) for bundle, node in order]


def _check_hosts(order: list[tuple[int, str]], topology) -> None:
    """The placement must have the hosts the plans were checked against (--nnodes)."""
    counts = [sum(1 for _, n in order if n == node) for node in dict.fromkeys(n for _, n in order)]
    if counts != [topology.gpus_per_node] * topology.nnodes:
        raise ValueError(f"Ray placed the ranks {counts} per host; the plans were made for "
                         f"{topology.nnodes} host(s) of {topology.gpus_per_node}: give "
                         f"--nnodes {len(counts)} (and --gpus-per-node) to match the cluster")
