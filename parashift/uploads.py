"""Host lists to device tensors without stalling the host. A copy from pageable memory
waits for the stream to drain, which would serialise the host with the step already
running on the GPU (async scheduling); from pinned memory it is queued like a kernel."""
import math

import numpy as np
import torch

ALIGN = 8  # bytes: every array of a pack starts at a multiple of int64's size
MAX_LAYOUTS = 256  # a slot's layouts kept with their views (more: forgotten, made again)


def upload(values, dtype: torch.dtype | None, device: torch.device) -> torch.Tensor:
    t = torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t


def upload_each(arrays: list[tuple[np.ndarray, torch.dtype]], device: torch.device
                ) -> list[torch.Tensor]:
    """What `StagingRing.upload` returns, one fresh tensor per array (tests, profiling)."""
    return [upload(values, dtype, device) for values, dtype in arrays]


_STREAMS: dict[int, torch.cuda.Stream] = {}


def current_stream(device: torch.device) -> torch.cuda.Stream:
    """torch.cuda.current_stream(device), found by the raw stream's handle (a C call)
    instead of through the device-index checks that cost tens of microseconds a step."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    handle = torch._C._cuda_getCurrentRawStream(index)
    stream = _STREAMS.get(handle)
    if stream is None or stream.device_index != index:
        stream = _STREAMS[handle] = torch.cuda.current_stream(index)
    return stream


class FreshUploads:
    """A StagingRing's `reserve` and `send` with fresh arrays and a tensor each (tests,
    profiling, callers without a ring)."""

    def __init__(self, device: torch.device):
        self.device, self.pending = device, None

    def reserve(self, shapes, into=None) -> tuple[list[np.ndarray], None]:
        self.pending = [(np.zeros(shape, _NUMPY[dtype]), dtype) for shape, dtype in shapes]
        return [a for a, _ in self.pending], None

    def send(self) -> list[torch.Tensor]:
        arrays, self.pending = self.pending, None
        return upload_each(arrays, self.device)


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
        self.layouts: dict[tuple, tuple[list[int], int]] = {}  # (shapes, into) -> offsets
        self.views: list[dict] = [{} for _ in range(depth)]  # per slot: layout -> views
        self.pending = None  # the pack reserved and not yet sent
        self.copied: list[torch.cuda.Event | None] = [None] * depth

    def upload(self, arrays: list[tuple[np.ndarray, torch.dtype]],
               into: torch.Tensor | None = None) -> list[torch.Tensor]:
        """`into`: a device buffer of bytes (a CUDA graph's inputs) that the pack is copied
        to instead of the slot's, laid out as `pack_offsets` says."""
        arrays = [(np.asarray(values, _NUMPY[dtype]), dtype) for values, dtype in arrays]
        host, _ = self.reserve([(a.shape, dtype) for a, dtype in arrays], into)
        for (a, _), target in zip(arrays, host):
            target[...] = a
        return self.send()

    def reserve(self, shapes: list[tuple[tuple[int, ...], torch.dtype]],
                into: torch.Tensor | None = None
                ) -> tuple[list[np.ndarray], list[torch.Tensor]]:
        """A pack of arrays of these shapes, to be written in place: their host views (in
        the slot's pinned buffer) and the device tensors they become once `send` copies
        them (views of the slot's device buffer, or of `into`). The same layout in the same
        slot gives the same views, made once."""
        shapes = tuple(shapes)
        key = (shapes, None if into is None else (into.data_ptr(), into.numel()))
        layout = self.layouts.get(key)
        if layout is None:
            if len(self.layouts) > MAX_LAYOUTS * 16:  # eager steps' shapes vary without end
                self.layouts.clear()
            layout = self.layouts[key] = pack_offsets(
                [math.prod(shape) * dtype.itemsize for shape, dtype in shapes])
        offsets, total = layout
        slot = self._take_slot(max(total, ALIGN))
        if into is not None and total > into.numel():
            raise ValueError(f"a pack of {total} bytes does not fit the {into.numel()} given")
        views = self.views[slot].get(key)
        if views is None:
            if len(self.views[slot]) > MAX_LAYOUTS:
                self.views[slot].clear()
            views = self.views[slot][key] = self._views(slot, shapes, offsets, into, total)
        self.pending = (slot, views)
        return views[0], views[1]

    def send(self) -> list[torch.Tensor]:
        """Copies the pack last reserved to the device (queued on the current stream);
        returns its device tensors."""
        slot, (_, views, copy) = self.pending
        self.pending = None
        if copy is not None:
            copy[0].copy_(copy[1], non_blocking=True)
        if self.on_cuda:
            self.copied[slot].record(current_stream(self.device))
        return views

    def _views(self, slot: int, shapes: tuple, offsets: list[int], into: torch.Tensor | None,
               total: int) -> tuple[list[np.ndarray], list[torch.Tensor], tuple | None]:
        """The pack's host views, its device views, and the (device, host) bytes that
        `send` copies (None: the host's are the device's), each made once per layout: on
        a step's cold caches a tensor's slicing costs as much as the copy."""
        host_as = self.host_as[slot]
        dev_as = self.dev_as[slot] if into is None else self._views_of(into)
        host, dev = [], []
        for (shape, dtype), start in zip(shapes, offsets):
            first, count = start // dtype.itemsize, math.prod(shape)
            host.append(host_as[dtype][first:first + count].reshape(shape))
            dev.append(dev_as[dtype][first:first + count].view(shape))
        copy = None
        if self.on_cuda or into is not None:
            target = self.dev[slot] if into is None else into
            copy = (target[:total], self.host[slot][:total])
        return host, dev, copy

    def preallocate(self, nbytes: int) -> None:
        """Every slot's buffers at least `nbytes` now (at start-up: a step's first long pack
        would otherwise pin a larger buffer for its slot, in its step, once per slot)."""
        for slot in range(self.depth):
            if self.host[slot] is None or self.host[slot].numel() < nbytes:
                self._grow(slot, max(nbytes, self.initial_bytes))

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
        self.views[slot].clear()
        host_bytes = self.host[slot].numpy()
        self.host_as[slot] = {dtype: host_bytes.view(t) for dtype, t in _NUMPY.items()}
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
