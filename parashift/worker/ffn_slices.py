"""SiDP's weights on one rank (worker/shared_ffn.py runs them): its owned slices of every
FFN layer, in one buffer its peers map, and the few slots a layer's whole TP shard is
fetched into from the owners (Weight-as-a-Service). FP8 weights travel with their scales:
gate and up's per row, in the slice; down's per output row, whole on every rank (made over
whole rows at load), so never fetched."""
import os
import uuid
from dataclasses import dataclass, fields

import torch
import torch.distributed as dist
from torch import nn

from parashift.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from parashift.parallel.state import GroupHandle

WAS_WEIGHTS, CAS_WEIGHTS = "sidp-was", "sidp-cas"
SHM_DIR = "/dev/shm"
_ALIGN = 16  # bytes: each tensor of the owned buffer starts at a multiple


@dataclass
class FfnSlice:
    """One layer's slice: gate and up rows ([gate | up], 2 s rows) with their bias and FP8
    scales where the layer has them, down columns (s)."""
    gate_up: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    gate_up_scale: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        return self.down.shape[1]

    def fields(self) -> list[torch.Tensor | None]:
        return [getattr(self, f.name) for f in fields(self)]

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in self.fields() if t is not None]


def ffn_modules(model: nn.Module) -> list[nn.Module]:
    """The model's dense FFN blocks (gate_up and down projections), in layer order."""
    return [m for m in model.modules()
            if isinstance(getattr(m, "gate_up_proj", None), MergedColumnParallelLinear)
            and isinstance(getattr(m, "down_proj", None), RowParallelLinear)]


def _slice_of(module: nn.Module) -> FfnSlice:
    gate_up = module.gate_up_proj
    return FfnSlice(gate_up.weight.data, _data(gate_up.bias), module.down_proj.weight.data,
                    _data(gate_up.weight_scale))


def _data(param) -> torch.Tensor | None:
    return None if param is None else param.data


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def _nbytes(like: list[FfnSlice]) -> int:
    return sum(_aligned(t.nbytes) for piece in like for t in piece.tensors())


def _carve(buffer: torch.Tensor, like: list[FfnSlice]) -> list[FfnSlice]:
    """Views of the byte `buffer` shaped and typed as `like`'s tensors, one after another."""
    offset, carved = 0, []
    for piece in like:
        views = []
        for t in piece.fields():
            if t is None:
                views.append(None)
                continue
            views.append(buffer[offset:offset + t.nbytes].view(t.dtype).view(t.shape))
            offset += _aligned(t.nbytes)
        carved.append(FfnSlice(*views))
    return carved


class OwnedSlices:
    """This rank's slices of every FFN layer, moved into one buffer that its peers map
    (the parameters become views of it), and the peers' buffers, by position."""

    def __init__(self, modules: list[nn.Module], peers: GroupHandle, device: torch.device):
        own = [_slice_of(m) for m in modules]
        numel = _nbytes(own)
        path = None
        if device.type == "cuda":
            buffer = torch.empty(numel, dtype=torch.uint8, device=device)
        else:
            path = os.path.join(SHM_DIR, f"parashift-sidp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            buffer = torch.from_file(path, shared=True, size=numel, dtype=torch.uint8)
        self.local = _carve(buffer, own)
        for module, piece, old in zip(modules, self.local, own):
            for new_t, old_t in zip(piece.tensors(), old.tensors()):
                new_t.copy_(old_t)
            module.gate_up_proj.weight.data = piece.gate_up
            if piece.gate_up_bias is not None:
                module.gate_up_proj.bias.data = piece.gate_up_bias
            if piece.gate_up_scale is not None:
                module.gate_up_proj.weight_scale.data = piece.gate_up_scale
            module.down_proj.weight.data = piece.down
        self.nbytes = buffer.nbytes
        buffers = _peer_buffers(buffer, path, numel, peers)
        self.by_peer = [_carve(b, own) for b in buffers]


def _peer_buffers(buffer: torch.Tensor, path: str | None, numel: int,
                  peers: GroupHandle) -> list[torch.Tensor]:
    """Every peer's buffer, by position (this rank's own at its position): the CPU maps
    each peer's file, then each rank removes its own (the mappings stay); a GPU opens each
    peer's CUDA IPC handle."""
    if buffer.is_cuda:
        from torch.multiprocessing.reductions import reduce_tensor
        handles = peers.all_gather_object(reduce_tensor(buffer))
        return [buffer if p == peers.rank else rebuild(*args)
                for p, (rebuild, args) in enumerate(handles)]
    paths = peers.all_gather_object(path)
    mapped = [buffer if p == peers.rank else
              torch.from_file(other, shared=True, size=numel, dtype=buffer.dtype)
              for p, other in enumerate(paths)]
    dist.barrier(group=peers.group)
    os.unlink(path)
    return mapped


def _empty_slot(piece: FfnSlice, owners: int, device: torch.device) -> FfnSlice:
    """A slot for the whole shard of `owners` slices shaped as `piece`: their gate and up
    rows (and those rows' bias and scales), their down columns."""
    def rows_of(t):
        return None if t is None else torch.empty(owners * t.shape[0], *t.shape[1:],
                                                  dtype=t.dtype, device=device)
    down = piece.down
    return FfnSlice(rows_of(piece.gate_up), rows_of(piece.gate_up_bias),
                    torch.empty(down.shape[0], owners * down.shape[1], dtype=down.dtype,
                                device=device), rows_of(piece.gate_up_scale))


class FfnSlots:
    """A few slots, each one FFN layer's whole TP shard, filled from the owners' slices
    (layer i in slot i % count); each layer's WaS layout reads its slot."""

    def __init__(self, modules: list[nn.Module], owners: OwnedSlices, position: int, count: int,
                 device: torch.device):
        shapes = {tuple(t.shape for t in piece.tensors()) for piece in owners.local}
        if len(shapes) != 1:
            raise ValueError("shared FFN weights need every layer's FFN of one shape")
        self.owners, self.position, self.modules = owners, position, modules
        d, piece = len(owners.by_peer), owners.local[0]
        rows = piece.rows
        self.slots = [_empty_slot(piece, d, device) for _ in range(count)]
        self.nbytes = sum(t.nbytes for slot in self.slots for t in slot.tensors())
        self.held = [-1] * count  # the layer each slot holds
        self.bytes_fetched = 0  # from peers (this rank's own slice is a local copy)
        self.copy_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.ready_events: dict[int, torch.cuda.Event] = {}  # slot -> its fetch's end
        for index, module in enumerate(modules):
            slot = self.slots[index % count]
            module.gate_up_proj.set_layout(
                WAS_WEIGHTS, [(slot.gate_up, slot.gate_up_bias, slot.gate_up_scale)],
                separate=False, split=(1, [d * rows] * 2))
            down = module.down_proj
            module.down_proj.set_layout(
                WAS_WEIGHTS, [(slot.down, _data(down.bias), _data(down.weight_scale))],
                separate=False)

    def fetch(self, layer: int) -> None:
        """Copies every owner's slice of `layer` into its slot."""
        k = layer % len(self.slots)
        slot = self.slots[k]
        half = slot.gate_up.shape[0] // 2
        for p, owner in enumerate(self.owners.by_peer):
            piece = owner[layer]
            s = piece.rows
            for into, rows in ((slot.gate_up, piece.gate_up), (slot.gate_up_bias,
                               piece.gate_up_bias), (slot.gate_up_scale, piece.gate_up_scale)):
                if rows is not None:  # gate's rows, then up's
                    into[p * s:(p + 1) * s].copy_(rows[:s], non_blocking=True)
                    into[half + p * s:half + (p + 1) * s].copy_(rows[s:], non_blocking=True)
            slot.down[:, p * s:(p + 1) * s].copy_(piece.down, non_blocking=True)
            if p != self.position:
                self.bytes_fetched += sum(t.nbytes for t in piece.tensors())
        self.held[k] = layer

    def ready(self, layer: int) -> None:
        """Before `layer`'s FFN: its slot holds it (waiting for its prefetch, or fetching
        it now)."""
        k = layer % len(self.slots)
        event = self.ready_events.pop(k, None)
        if event is not None:
            torch.cuda.current_stream().wait_event(event)
        if self.held[k] != layer:
            self.fetch(layer)

    def release(self, layer: int) -> None:
        """After `layer`'s FFN: its slot takes the layer `len(slots)` ahead (past the last
        layer, the next step's first ones, where they use this slot), on the copy stream
        once this layer's kernels are done reading it (GPU)."""
        k, ahead = layer % len(self.slots), (layer + len(self.slots)) % len(self.modules)
        if self.held[k] == ahead or ahead % len(self.slots) != k:
            return
        if self.copy_stream is None:
            self.fetch(ahead)
            return
        self.copy_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.copy_stream):
            self.fetch(ahead)
            self.ready_events[k] = torch.cuda.Event()
            self.ready_events[k].record()
