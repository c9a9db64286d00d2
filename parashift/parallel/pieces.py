"""Boxes of checkpoint tensors and the pieces of parameters that hold them: what
loader/weight_pieces.py learns from the layers' loaders and parallel/reshard_schedule.py
moves between ranks. A `Piece`: the box `full` of checkpoint tensor `tensor` is the box
`at` of the parameter (the parameter's `dims` match the tensor's dims in order; a
parameter dim not among them is indexed, one wide); `tensor` None: zeros."""
from dataclasses import dataclass

Box = tuple[tuple[int, int], ...]  # per dim: [start, stop)


@dataclass(frozen=True)
class Piece:
    tensor: str | None
    full: Box
    at: Box
    dims: tuple[int, ...]

    def to_param(self, full: Box) -> Box:
        """The box of the parameter that holds `full` (inside this piece's `full`)."""
        at = list(self.at)
        for (start, stop), (lo, _), dim in zip(full, self.full, self.dims):
            base = self.at[dim][0] - lo
            at[dim] = (base + start, base + stop)
        return tuple(at)


def volume(box: Box) -> int:
    n = 1
    for start, stop in box:
        n *= max(0, stop - start)
    return n


def intersect(a: Box, b: Box) -> Box:
    return tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b))
