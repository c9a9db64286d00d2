"""Low-latency all-reduce of small CUDA messages over symmetric (peer-to-peer) memory.

Each rank copies its message into a buffer that every rank of the group can read,
then one kernel reads all the ranks' buffers and sums them (PyTorch's one-shot
all-reduce, `torch.ops.symm_mem.one_shot_all_reduce`). The buffer is allocated and
rendezvoused once, at start-up, so calls are CUDA-graph capturable. Messages the
buffer or the kernel cannot take go to dist.all_reduce (NCCL)."""
import logging
import os

import torch
import torch.distributed as dist

from parashift.parallel.topology import peer_access_disabled

try:
    import torch.distributed._symmetric_memory as symm_mem
except ImportError:  # a torch built without distributed support
    symm_mem = None

logger = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 4 << 20  # measured on 2xH200 in graphs: one-shot wins at 1 MiB, NCCL at 8 MiB
DTYPES = (torch.bfloat16, torch.float32)  # what the one-shot kernel is built for
_logged: set[str] = set()


def fits(x: torch.Tensor, buffer: torch.Tensor | None) -> bool:
    """Whether the one-shot kernel can reduce `x` through `buffer` (uint8): same device,
    a dtype it supports, contiguous, at most the buffer's size, a multiple of 4 bytes."""
    return (buffer is not None and x.device == buffer.device and x.dtype in DTYPES
            and x.is_contiguous() and x.nbytes <= buffer.numel() and x.nbytes % 4 == 0)


class FastAllReduce:
    """One-shot all-reduce for one process group. Every rank of the group must construct
    it, in the same order relative to the group's other collectives (the rendezvous is
    one). Where it cannot be set up, every call falls back to dist.all_reduce."""

    def __init__(self, group, device: torch.device, max_bytes: int = DEFAULT_MAX_BYTES):
        self.group = group
        rendezvoused = symmetric_buffer(group, torch.device(device), max_bytes)
        self.buffer = None if rendezvoused is None else rendezvoused[0]

    @property
    def available(self) -> bool:
        return self.buffer is not None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of `x` over the group: a new tensor on the fast path, `x` reduced in
        place on the fallback."""
        if not fits(x, self.buffer):
            dist.all_reduce(x, group=self.group)
            return x
        staged = self.buffer[:x.nbytes].view(x.dtype).view(x.shape)
        staged.copy_(x)
        return torch.ops.symm_mem.one_shot_all_reduce(staged, "sum", self.group.group_name)


def symmetric_buffer(group, device: torch.device, max_bytes: int):
    """A rendezvoused uint8 buffer of `max_bytes` and its symmetric-memory handle, or None
    (logged) where unavailable. A collective of the group."""
    reason = _unavailable_reason(group, device)
    if reason is not None:
        _log_once(reason)
        return None
    # the one-shot kernel reads peers' memory directly: keep rendezvous from setting up
    # NVLink multicast (which it would where the device supports it)
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    buffer, handle, error = None, None, None
    try:
        buffer = symm_mem.empty(max_bytes, dtype=torch.uint8, device=device)
        handle = symm_mem.rendezvous(buffer, group.group_name)
    except Exception as e:  # any failure: fall back, on every rank
        error = e
    if not _all_ranks_agree(error is None, group, device):
        _log_once(f"symmetric-memory rendezvous failed: {error or 'on another rank'}")
        return None
    return buffer, handle


def _unavailable_reason(group, device: torch.device) -> str | None:
    """Why the fast path cannot run here; the same answer on every rank of the group."""
    if peer_access_disabled():  # (a PCIe-like run's one-shot reads would still use NVLink)
        return "NCCL_P2P_DISABLE is set"
    if device.type != "cuda":
        return f"device is {device.type}, not CUDA"
    if symm_mem is None or not hasattr(torch.ops.symm_mem, "one_shot_all_reduce"):
        return f"torch {torch.__version__} has no symmetric-memory one-shot all-reduce"
    if dist.get_world_size(group) == 1:
        return "group of one rank"
    return None


def _all_ranks_agree(ok: bool, group, device: torch.device) -> bool:
    """True when `ok` holds on every rank of the group (a collective)."""
    flag = torch.tensor([int(ok)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def _log_once(reason: str) -> None:
    if reason not in _logged:
        _logged.add(reason)
        logger.info("fast all-reduce off (%s): all-reduces use dist.all_reduce", reason)
