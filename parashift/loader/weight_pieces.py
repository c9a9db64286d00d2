"""Which part of which checkpoint tensor each parameter of a rank's model holds, learnt by
running the model's own weight loaders (`load_weights`, the layers' `weight_loader`s) on
probes instead of tensors: a checkpoint tensor is a `LazySlice` whose reads return the
box they narrowed to, and a parameter is a `Target` that records each box it receives and
where. So a TP shard's rows, a row-parallel shard's columns, q/k/v or gate/up packed in one
matrix, KV heads replicated past the KV head count, a vocabulary shard's padding, a
stage's layers and tied embeddings come out as the layers define them, with no model
named here. Nothing is read from the checkpoint but its tensors' shapes.

A `Piece` (parallel/pieces.py) is one such copy: the box `full` of checkpoint tensor
`tensor` is the box `at` of the parameter (the parameter's `dims` match the tensor's dims
in order; a parameter dim not among them is indexed, one wide: an expert's slot of stacked
experts). A piece whose `tensor` is None is zeros (a vocabulary shard's rows past the
vocabulary)."""
from pathlib import Path

import torch
from torch import nn

from parashift.lazy_tensor import LazySlice
from parashift.loader.weights import iterate_safetensors, load_weights
from parashift.parallel.pieces import Box, Piece, intersect, volume

class _Read:
    """What a probe checkpoint tensor gives when a loader reads it: its name and box."""

    def __init__(self, name: str, box: Box):
        self.name, self.box = name, box
        self.shape = torch.Size(stop - start for start, stop in box)

    def dim(self) -> int:
        return len(self.shape)


class _Reads:
    """The `source` of a probe LazySlice: indexing it gives a `_Read`, not bytes."""

    def __init__(self, name: str):
        self.name = name

    def __getitem__(self, index: tuple[slice, ...]) -> _Read:
        return _Read(self.name, tuple((s.start, s.stop) for s in index))


class Target:
    """A probe parameter's storage (or a view of it) as a loader writes it: the box of
    the parameter it covers and the parameter dims still visible (integer indexing drops
    one). Records every copy into `pieces`."""

    def __init__(self, box: Box, visible: tuple[int, ...], pieces: list[Piece]):
        self.box, self.visible, self.pieces = box, visible, pieces
        self.shape = torch.Size(box[d][1] - box[d][0] for d in visible)

    def dim(self) -> int:
        return len(self.visible)

    def narrow(self, dim: int, start: int, length: int) -> "Target":
        dim = self.visible[dim % self.dim()]
        if not 0 <= start <= start + length <= self.box[dim][1] - self.box[dim][0]:
            raise ValueError(f"narrow({dim}, {start}, {length}) is outside {self.box}")
        box = list(self.box)
        box[dim] = (self.box[dim][0] + start, self.box[dim][0] + start + length)
        return Target(tuple(box), self.visible, self.pieces)

    def __getitem__(self, index) -> "Target":
        if isinstance(index, int):
            size = self.shape[0]
            if not -size <= index < size:
                raise IndexError(f"index {index} is outside {size}")
            part = self.narrow(0, index % size, 1)
            return Target(part.box, self.visible[1:], self.pieces)
        if isinstance(index, slice) and index.step in (None, 1):
            start, stop, _ = index.indices(self.shape[0])
            return self.narrow(0, start, max(0, stop - start))
        raise TypeError(f"a weight probe reads int or slice indexes of dim 0, got {index!r}")

    def copy_(self, source) -> "Target":
        if not isinstance(source, _Read):
            raise TypeError(f"a loader wrote {type(source).__name__} into a parameter, not "
                            "a checkpoint tensor's slice")
        if tuple(source.shape) != tuple(self.shape):
            raise ValueError(f"a loader copied {tuple(source.shape)} into {tuple(self.shape)}")
        self._record(Piece(source.name, source.box, self.box, self.visible))
        return self

    def zero_(self) -> "Target":
        if volume(self.box):
            self._record(Piece(None, (), self.box, ()))
        return self

    def _record(self, piece: Piece) -> None:
        """A later write of the same box replaces an earlier one (as copies would)."""
        for i, old in enumerate(self.pieces):
            if old.at == piece.at:
                self.pieces[i] = piece
                return
            if volume(intersect(old.at, piece.at)):
                raise ValueError(f"two loads write parts of the same rows: {old.at}, {piece.at}")
        self.pieces.append(piece)


class _ProbeParam:
    """Stands for a parameter in `load_weights`: its shape, its loader, a `Target` as data."""

    def __init__(self, param: nn.Parameter):
        self.shape = param.shape
        self.pieces: list[Piece] = []
        self.data = Target(tuple((0, n) for n in param.shape), tuple(range(param.dim())),
                           self.pieces)
        loader = getattr(param, "weight_loader", None)
        if loader is not None:
            self.weight_loader = loader


def checkpoint_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Each safetensors tensor's shape (its header only)."""
    return {name: tuple(t.shape) for name, t in iterate_safetensors(path)}


def config_checkpoint_shapes(hf_config) -> dict[str, tuple[int, ...]]:
    """The tensor shapes a Hugging Face checkpoint of `hf_config` holds (transformers' own
    model of it on the meta device): the checkpoint random weights stand for."""
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    # tied weights once, by name as a safetensors file lists them
    return {name: tuple(p.shape) for name, p in sorted(model.named_parameters())}


def parameter_pieces(model: nn.Module,
                     shapes: dict[str, tuple[int, ...]]) -> dict[str, list[Piece]]:
    """Each parameter's pieces (by name, tied parameters once), as loading a checkpoint of
    these tensor shapes into `model` would fill it (the model may be on the meta device).
    Raises ValueError where a loader does what a probe cannot follow, or a parameter is
    not covered exactly once."""
    params = {name: _ProbeParam(p) for name, p in model.named_parameters()}
    load_weights(model, [(name, LazySlice(_Reads(name), shape)) for name, shape in shapes.items()],
                 params)
    for name, probe in params.items():
        covered = sum(volume(piece.at) for piece in probe.pieces)
        if covered != probe.shape.numel():
            raise ValueError(f"loading fills {covered} of {probe.shape.numel()} elements of "
                             f"{name}")
    return {name: probe.pieces for name, probe in params.items()}
