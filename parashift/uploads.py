"""Host lists to device tensors without stalling the host. A copy from pageable memory
waits for the stream to drain, which would serialise the host with the step already
running on the GPU (async scheduling); from pinned memory it is queued like a kernel."""
import numpy as np
import torch

ALIGN = 8  # bytes: every array of a pack starts at a multiple of int64's size


def upload(values, dtype: torch.dtype | None, device: torch.device) -> torch.Tensor:
    t = torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t


def upload_each(arrays: list[tuple[np.ndarray, torch.dtype]], device: torch.device
                ) -> list[torch.Tensor]:
    """What `StagingRing.upload` returns, one fresh tensor per array (tests, profiling)."""
    return [upload(values, dtype, device) for values, dtype in arrays]


def pack_offsets(sizes: list[int]) -> tuple[list[int], int]:
    """Where arrays of these byte sizes start in a pack, and the pack's bytes."""
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        total += -(-size // ALIGN) * ALIGN
    return offsets, total


class StagingRing:
    """A step's host arrays to the device in one copy: packed into a persistent pinned
    buffer and copied, non-blocking, into a persistent device buffer, of which the
    returned tensors are views. `depth` slots (each a pinned and a device buffer) are
    used in turn, so a pack never rewrites a pinned buffer whose copy may still be queued
    behind the step in flight: its slot's event is waited on first (it has long passed
    when the ring covers two steps' packs). The device buffer is rewritten by a copy on
    the same stream as the kernels that read it, so after them. A view is valid until
    its slot comes round again (`depth` packs later). Buffers grow (doubling) when a pack
    does not fit. On the CPU the host buffer is the device buffer (no copy), so CPU runs
    exercise the same packing (`--check-step-state` compares what it gives)."""

    def __init__(self, device: torch.device, depth: int = 8, initial_bytes: int = 1 << 16):
        self.device, self.on_cuda = device, device.type == "cuda"
        self.depth, self.next_slot, self.initial_bytes = depth, 0, initial_bytes
        self.host: list[torch.Tensor | None] = [None] * depth
        self.dev: list[torch.Tensor | None] = [None] * depth
        # each buffer viewed as every dtype a pack holds, made once (a view costs as much as
        # the copy of a small array): numpy views of the host's, tensors of the device's
        self.host_as: list[dict | None] = [None] * depth
        self.dev_as: list[dict | None] = [None] * depth
        self.into_as: tuple[torch.Tensor | None, dict] = (None, {})
        self.copied: list[torch.cuda.Event | None] = [None] * depth

    def upload(self, arrays: list[tuple[np.ndarray, torch.dtype]],
               into: torch.Tensor | None = None) -> list[torch.Tensor]:
        """`into`: a device buffer of bytes (a CUDA graph's inputs) that the pack is copied
        to instead of the slot's, laid out as `pack_offsets` says."""
        arrays = [(np.asarray(values, _NUMPY[dtype]), dtype) for values, dtype in arrays]
        offsets, total = pack_offsets([a.nbytes for a, _ in arrays])
        slot = self._take_slot(max(total, ALIGN))
        host_as = self.host_as[slot]
        for (a, _), start in zip(arrays, offsets):
            first = start // a.itemsize
            host_as[a.dtype][first:first + a.size] = a.reshape(-1)
        if into is None:
            dev, dev_as = self.dev[slot], self.dev_as[slot]
        else:
            if total > into.numel():
                raise ValueError(f"a pack of {total} bytes does not fit the {into.numel()} given")
            dev, dev_as = into, self._views_of(into)
        if self.on_cuda or into is not None:
            dev[:total].copy_(self.host[slot][:total], non_blocking=True)
        if self.on_cuda:
            self.copied[slot].record(torch.cuda.current_stream(self.device))
        views = []
        for (a, dtype), start in zip(arrays, offsets):
            first = start // a.itemsize
            view = dev_as[dtype][first:first + a.size]
            views.append(view if a.ndim == 1 else view.view(a.shape))
        return views

    def _take_slot(self, nbytes: int) -> int:
        slot = self.next_slot
        self.next_slot = (slot + 1) % self.depth
        if self.copied[slot] is not None:
            self.copied[slot].synchronize()  # its last copy has left the pinned buffer
        if self.host[slot] is None or self.host[slot].numel() < nbytes:
            self._grow(slot, max(nbytes, self.initial_bytes,
                                 2 * (0 if self.host[slot] is None else self.host[slot].numel())))
        return slot

    def _grow(self, slot: int, size: int) -> None:
        size = -(-size // ALIGN) * ALIGN
        self.host[slot] = torch.empty(size, dtype=torch.uint8, pin_memory=self.on_cuda)
        host_bytes = self.host[slot].numpy()
        self.host_as[slot] = {np.dtype(t): host_bytes.view(t) for t in _NUMPY.values()}
        if self.on_cuda:
            self.dev[slot] = torch.empty(size, dtype=torch.uint8, device=self.device)
            self.copied[slot] = torch.cuda.Event()
        else:
            self.dev[slot] = self.host[slot]
        self.dev_as[slot] = {dtype: self.dev[slot].view(dtype) for dtype in _NUMPY}

    def _views_of(self, into: torch.Tensor) -> dict:
        if self.into_as[0] is not into:
            if into.numel() % ALIGN:
                raise ValueError(f"a buffer to pack into holds a multiple of {ALIGN} bytes, "
                                 f"not {into.numel()}")
            self.into_as = (into, {dtype: into.view(dtype) for dtype in _NUMPY})
        return self.into_as[1]


_NUMPY = {torch.int64: np.int64, torch.int32: np.int32, torch.bool: np.bool_,
          torch.float32: np.float32}
