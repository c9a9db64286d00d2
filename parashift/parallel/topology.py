"""Which ranks share a host. Ranks are numbered host by host (host h holds ranks
h*gpus_per_node to (h+1)*gpus_per_node - 1, as torchrun numbers them), so a plan's
innermost degrees (TP, then SP) land inside a host and its outer ones (PP, DP) across
hosts whenever TP*SP divides the ranks of a host.

Groups that run a collective in every layer (TP and SP; a shift plan's TP is its base's
SP_TP group, a merged plan's its replicas' DP_TP group) need the links inside a host; PP
stages and DP replicas exchange little and may cross hosts."""
import os
from dataclasses import dataclass

from parashift.parallel.plan import Plan

HOST_BOUND_KINDS = ("tp", "sp")  # kept inside a host


def peer_access_disabled() -> bool:
    """NCCL_P2P_DISABLE is set: GPUs without peer links, or a PCIe-like run on NVLink GPUs;
    nothing may read another GPU's memory directly."""
    return os.environ.get("NCCL_P2P_DISABLE", "0") not in ("", "0")


@dataclass(frozen=True)
class Topology:
    nnodes: int = 1
    gpus_per_node: int = 1  # ranks per host

    def __post_init__(self):
        for name in ("nnodes", "gpus_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

    @classmethod
    def for_world(cls, world_size: int, nnodes: int = 1,
                  gpus_per_node: int | None = None) -> "Topology":
        """`nnodes` hosts holding `world_size` ranks: `gpus_per_node` each (default: an
        even share)."""
        if gpus_per_node is None:
            if world_size % nnodes:
                raise ValueError(f"{world_size} ranks do not split evenly over nnodes = "
                                 f"{nnodes}; give gpus_per_node")
            gpus_per_node = world_size // nnodes
        topology = cls(nnodes, gpus_per_node)
        if topology.world_size != world_size:
            raise ValueError(f"nnodes * gpus_per_node = {nnodes} * {gpus_per_node} = "
                             f"{topology.world_size}, but the plan has {world_size} ranks")
        return topology

    @property
    def world_size(self) -> int:
        return self.nnodes * self.gpus_per_node

    def host_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def ranks_of(self, host: int) -> range:
        return range(host * self.gpus_per_node, (host + 1) * self.gpus_per_node)

    def hosts_of(self, ranks) -> list[int]:
        return sorted({self.host_of(r) for r in ranks})

    def within_host(self, ranks) -> bool:
        return len(self.hosts_of(ranks)) == 1

    def cross_host_groups(self, plan: Plan) -> list[tuple[str, tuple[int, ...]]]:
        """(kind, ranks) of each of `plan`'s host-bound groups that spans hosts."""
        return [(kind, group) for kind in HOST_BOUND_KINDS for group in plan.groups(kind)
                if not self.within_host(group)]

    def check_plan(self, plan: Plan) -> None:
        """Refuses a plan with a TP or SP group across hosts, naming it."""
        crossing = self.cross_host_groups(plan)
        if crossing:
            kind, group = crossing[0]
            raise ValueError(
                f"plan {plan.name()} puts its {kind} group {list(group)} on hosts "
                f"{self.hosts_of(group)} ({self.gpus_per_node} ranks per host): TP and SP "
                "groups stay inside a host; put PP stages or DP replicas across hosts, or "
                "pass --allow-cross-host-tp")

    def check_plans(self, plans, allow_cross_host: bool = False) -> None:
        for plan in plans:
            if max(plan.ranks) >= self.world_size:
                raise ValueError(f"plan {plan.name()} uses ranks outside {self.nnodes} host(s) "
                                 f"of {self.gpus_per_node} ranks")
            if not allow_cross_host:
                self.check_plan(plan)

    def check_layout(self, layout, allow_cross_host: bool = False) -> None:
        self.check_plans(layout.plans, allow_cross_host)


def describe_placement(plan: Plan, topology: Topology) -> str:
    """Each host's ranks and what they hold, then every group with the hosts it spans."""
    lines = [f"placement of {plan.name()} on {topology.nnodes} host(s) x "
             f"{topology.gpus_per_node} rank(s):"]
    for host in range(topology.nnodes):
        held = [r for r in topology.ranks_of(host) if r in plan.ranks]
        coords = ", ".join(f"{r} (dp={plan.coords(r).dp} pp={plan.coords(r).pp} "
                           f"sp={plan.coords(r).sp} tp={plan.coords(r).tp})" for r in held)
        if held:
            lines.append(f"  host {host}: ranks {coords}")
    for kind in ("tp", "sp", "pp", "dp"):
        for group in (g for g in plan.groups(kind) if len(g) > 1):
            hosts = topology.hosts_of(group)
            where = f"host {hosts[0]}" if len(hosts) == 1 else \
                f"across hosts {','.join(map(str, hosts))}"
            lines.append(f"  {kind} group {list(group)}: {where}")
    return "\n".join(lines)
