"""Checkpoint tensors that are read only where a rank narrows them, so each rank
reads its own shard of a safetensors file and not the whole tensor."""
import torch


class LazySlice:
    def __init__(self, source, shape: tuple[int, ...], index: tuple[slice, ...] | None = None):
        self.source = source  # a safetensors slice: indexable by a tuple of slices
        self.index = index or tuple(slice(0, n) for n in shape)
        self.shape = torch.Size(s.stop - s.start for s in self.index)

    def dim(self) -> int:
        return len(self.shape)

    def narrow(self, dim: int, start: int, length: int) -> "LazySlice":
        base = self.index[dim].start
        index = list(self.index)
        index[dim] = slice(base + start, base + start + length)
        return LazySlice(self.source, (), tuple(index))

    def __getitem__(self, rows: slice) -> "LazySlice":
        start, stop, _ = rows.indices(self.shape[0])
        return self.narrow(0, start, max(0, stop - start))

    def materialize(self) -> torch.Tensor:
        return self.source[self.index]


def as_tensor(t) -> torch.Tensor:
    return t.materialize() if isinstance(t, LazySlice) else t
