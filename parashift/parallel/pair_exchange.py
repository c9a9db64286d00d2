"""Two ranks' fp32 terms exchanged through symmetric memory by the kernel that makes them.

Deterministic mode adds a TP=2 row-parallel projection's two halves in fp32
(parashift/deterministic/reduction.py). Here each rank's GEMM stores its half twice: into
its own buffer and, through NVLink, into its peer's, at its TP position of the current
slot; a barrier follows, and each rank then adds the two halves from its own memory. The
transfer overlaps the GEMM, and nothing is staged or reduced by a collective kernel.

Each rank's buffer holds two slots of two terms. A rank writes into its peer's slot s
while the peer may still read slot s from its last use, so slots alternate: the peer
reaches the barrier of the exchange in between only after its add that read slot s.
Across steps the slots need not alternate (a CUDA graph replays the slots it was captured
with), so the first exchange of each step (a new step token) waits on a barrier before
its writes too. Every rank of the pair must exchange in the same sequence."""
import torch
import torch.distributed as dist

from parashift.parallel.fast_all_reduce import symmetric_buffer

DEFAULT_TERM_BYTES = 16 << 20  # one term: 1,024 rows of 4,096 fp32 columns; four per rank


class PairExchange:
    def __init__(self, group, device: torch.device, term_bytes: int = DEFAULT_TERM_BYTES):
        self.capacity = term_bytes // 4
        self.local = self.remote = self.handle = None
        self._slot, self._step = 0, None
        if dist.get_world_size(group) != 2:
            raise ValueError(f"a pair exchange takes two ranks, got {dist.get_world_size(group)}")
        rendezvoused = symmetric_buffer(group, torch.device(device), 2 * 2 * self.capacity * 4)
        if rendezvoused is None:
            return  # logged: every exchange falls back to the all-reduce
        buffer, self.handle = rendezvoused
        self.local = buffer.view(torch.float32).view(2, 2, self.capacity)
        self.remote = self.handle.get_buffer(1 - self.handle.rank, (2, 2, self.capacity),
                                             torch.float32)

    @property
    def available(self) -> bool:
        return self.handle is not None

    def fits(self, rows: int, n: int) -> bool:
        return self.available and rows * n <= self.capacity

    def slot(self, rows: int, n: int, position: int, step: object
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The next slot as (both terms [2, rows, n] in position order, this rank's term
        [1, rows, n] here and its mirror [1, rows, n] in the peer's buffer). `position`:
        this rank's in the pair's order (the TP group's, which plans may order otherwise);
        `step` identifies the forward step (the step context: a new object each step, kept
        alive here so no later one shares its identity)."""
        if step is not self._step:
            self._step = step
            self.handle.barrier()
        self._slot ^= 1
        size = rows * n
        terms = self.local[self._slot, :, :size].view(2, rows, n)
        mirror = self.remote[self._slot, position, :size].view(1, rows, n)
        return terms, terms[position:position + 1], mirror

    def exchange(self) -> None:
        """After both ranks stored their terms: each rank's slot holds both."""
        self.handle.barrier()
