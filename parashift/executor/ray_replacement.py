"""Replacements under Ray: replacement.py's `Hosts` for ranks that are Ray actors.

A lost rank gets a new actor on the lost one's placement-group bundle, so on the same
node and device (`RayRanks.restart`); Ray places it once the dead actor's resources are
free. It connects to the engine on the port the start-up actors used, which stays open
(`Rejoins`), and from there is a replacement as any other: it meets its group's other
new ranks at the spec's rendezvous generation, loads the weights and reports ready."""
from parashift.executor.node_link import Rejoins, RemoteRank
from parashift.executor.ray_ranks import RayRanks


class RayHosts:
    def __init__(self, ray_ranks: RayRanks):
        self.ray_ranks = ray_ranks
        self.links = {0: ray_ranks}  # shut down with the executor's other links
        self.rejoins = Rejoins(("", ray_ranks.address[1]))

    def is_remote(self, rank: int) -> bool:
        """Every rank is an actor: its connection comes through `rejoins`."""
        return True

    def check_up(self, ranks) -> None:
        """Nothing to wait for: Ray places the actor once its bundle can hold it (a lost
        node's bundle is placed again by Ray; the attempt's timeout bounds the wait)."""

    def start(self, spec, ranks) -> dict[int, tuple[RemoteRank, None]]:
        return {rank: (self.ray_ranks.restart(rank, spec), None) for rank in ranks}

    def shutdown(self, grace_s: float) -> None:
        self.rejoins.close()
