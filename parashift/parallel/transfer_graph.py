"""The read-before-write graph of a re-shard phase's transfers (parallel/reshard_schedule.py)
as arrays, and the breaking of its cycles that do not fit one round's staging.

`break_cycles` peels a strongly connected component that does not fit by reading its
piece whose read the most writes of the component wait on (lowest index on a tie; a
piece read from a peer before one copied on its own rank) from the host copy, then splits
what is left into its components again, until every one fits. A peer's piece read from the
host instead crosses the receiver's PCIe link once as it would have crossed its peer link
(the same link under NCCL_P2P_DISABLE=1), where a local piece so read would cross PCIe
besides a device copy: on the 70B's PP2 -> TP2 this keeps every local byte local (the
host reads 24 GiB a switch instead of 26-32, and no rank receives more than the half it
lacks).
A 70B's phase has ~10^4 transfers in one component that loses ~10^3 pieces so, one at a
time: each step is a few array operations and a compiled strongly-connected-components
pass (scipy's), not a Python walk of the component."""
from dataclasses import replace

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components


class TransferGraph:
    """Transfers `transfers` (indexed 0..n-1) and edges i -> [j...] (i reads bytes j writes):
    the edges by source as CSR arrays, each transfer's bytes and its ranks' indices."""

    def __init__(self, transfers: list, edges: dict[int, list[int]]):
        n = len(transfers)
        counts = np.fromiter((len(edges[i]) for i in range(n)), np.int64, n)
        self.starts = np.zeros(n + 1, np.int64)
        np.cumsum(counts, out=self.starts[1:])
        self.targets = np.fromiter((j for i in range(n) for j in edges[i]), np.int64,
                                   int(self.starts[-1]))
        self.live = np.ones(n, bool)  # False: the transfer's reads were moved to the host
        ranks = sorted({t.dst.rank for t in transfers} | {t.src.rank for t in transfers if t.src})
        index = {rank: k for k, rank in enumerate(ranks)}
        self.num_ranks = len(ranks)
        self.nbytes = np.fromiter((t.nbytes for t in transfers), np.int64, n)
        self.src_rank = np.fromiter((index[t.src.rank] if t.src else -1 for t in transfers),
                                    np.int64, n)
        self.dst_rank = np.fromiter((index[t.dst.rank] for t in transfers), np.int64, n)
        self.position = np.full(n, -1, np.int64)  # scratch: a node's index among `nodes`

    def fits(self, nodes: np.ndarray, staging_bytes: int) -> bool:
        """Whether a round of `nodes` stages at most `staging_bytes` per rank and direction
        (as reshard_schedule.staging_demand counts)."""
        src, dst, nbytes = self.src_rank[nodes], self.dst_rank[nodes], self.nbytes[nodes]
        staged = src >= 0
        send = np.bincount(src[staged], nbytes[staged], self.num_ranks)
        peer = staged & (src != dst)
        recv = np.bincount(dst[peer], nbytes[peer], self.num_ranks)
        return max(send.max(), recv.max()) <= staging_bytes

    def inner_edges(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The edges between `nodes` (sorted), as positions in `nodes`, by source."""
        readers = nodes[self.live[nodes]]
        first = self.starts[readers]
        counts = self.starts[readers + 1] - first
        offsets = np.repeat(first - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
        self.position[nodes] = np.arange(len(nodes))
        sources = np.repeat(self.position[readers], counts)
        targets = self.position[self.targets[offsets]]
        self.position[nodes] = -1
        kept = targets >= 0
        return sources[kept], targets[kept]

    def components(self, nodes: np.ndarray, sources: np.ndarray,
                   targets: np.ndarray) -> list[np.ndarray]:
        """The strongly connected components of the graph over `nodes` (sorted) whose edges
        are `inner_edges(nodes)`, each sorted."""
        size = len(nodes)
        if size <= 1:
            return [nodes] if size else []
        starts = np.zeros(size + 1, np.int64)
        np.cumsum(np.bincount(sources, minlength=size), out=starts[1:])
        matrix = csr_matrix((np.ones(len(targets), bool), targets, starts), (size, size))
        _, labels = connected_components(matrix, directed=True, connection="strong")
        order = np.argsort(labels, kind="stable")
        cuts = np.flatnonzero(np.diff(labels[order])) + 1
        return np.split(nodes[order], cuts)


def break_cycles(transfers: list, edges: dict[int, list[int]], staging_bytes: int,
                 cycle: dict[int, int]) -> list[list[int]]:
    """The components once every one fits a round; a victim's transfer in `transfers` reads
    the host copy instead (`cycle` counts its bytes on its rank) and loses its `edges`."""
    graph = TransferGraph(transfers, edges)
    everything = np.arange(len(transfers))
    pending, done = graph.components(everything, *graph.inner_edges(everything)), []
    while pending:
        nodes = pending.pop()
        if graph.fits(nodes, staging_bytes):
            done.append(nodes.tolist())
            continue
        sources, targets = graph.inner_edges(nodes)
        # a peer's read first, the member whose read the most members' writes wait on (the
        # first on a tie): a local copy the host then serves would cross PCIe besides
        waiting = np.bincount(sources, minlength=len(nodes))
        src = graph.src_rank[nodes]
        peer = (src >= 0) & (src != graph.dst_rank[nodes])
        chosen = int(np.argmax(np.where(peer, waiting, -1) if (peer & (waiting > 0)).any()
                               else waiting))
        victim = int(nodes[chosen])
        t = transfers[victim]
        transfers[victim] = replace(t, src=None)
        cycle[t.dst.rank] += t.nbytes
        edges[victim] = []
        graph.live[victim] = False
        graph.src_rank[victim] = -1
        kept = sources != chosen
        pending += graph.components(nodes, sources[kept], targets[kept])
    return done
