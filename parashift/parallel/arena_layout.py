"""Where Seesaw's weight arena puts each plan's parameters on a rank (parallel/
seesaw_weights.py): a plan's region holds its parameters in `named_parameters` order
(tied ones once), each aligned, chunked by layer; the first plan's region starts at the
arena's start, the second's ends at its end. A pure function of the models' structure, so
that every rank can lay out every rank's arena (from models built on the meta device) and
agree on a re-shard's transfers without asking (parallel/reshard_schedule.py)."""
from dataclasses import dataclass

from torch import nn

ALIGN = 256  # bytes: every parameter starts aligned, whatever its dtype


@dataclass(frozen=True)
class PlacedParam:
    name: str
    offset: int  # bytes from its region's start
    shape: tuple[int, ...]
    itemsize: int

    @property
    def nbytes(self) -> int:
        n = self.itemsize
        for size in self.shape:
            n *= size
        return n


@dataclass(frozen=True)
class PlanLayout:
    """One plan's region on one rank: its parameters, its per-layer chunks (start, stop
    byte ranges, in order) and its size."""
    params: tuple[PlacedParam, ...]
    chunks: tuple[tuple[int, int], ...]
    size: int

    def params_in(self, chunk: tuple[int, int]) -> list[PlacedParam]:
        return [p for p in self.params if chunk[0] <= p.offset < chunk[1]]


def unique_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    seen, out = set(), []
    for name, param in model.named_parameters():  # tied weights appear once
        if id(param) not in seen:
            seen.add(id(param))
            out.append((name, param))
    return out


def layer_of(name: str) -> str:
    """The layer a parameter belongs to ('model.layers.3' or the module above it)."""
    parts = name.split(".")
    return ".".join(parts[:3]) if parts[1:2] == ["layers"] else ".".join(parts[:-1])


def place(model: nn.Module) -> PlanLayout:
    """Each parameter's offset in a region, the per-layer chunks, and the region's size."""
    placed, chunks, offset, layer = [], [], 0, None
    for name, param in unique_parameters(model):
        if layer != layer_of(name):
            layer = layer_of(name)
            chunks.append((offset, offset))
        placed.append(PlacedParam(name, offset, tuple(param.shape), param.element_size()))
        offset += -(-param.nbytes // ALIGN) * ALIGN
        chunks[-1] = (chunks[-1][0], offset)
    return PlanLayout(tuple(placed), tuple(chunks), offset)


def region_offsets(sizes: list[int], arena_bytes: int) -> list[int]:
    """The two regions' offsets: the first at the arena's start, the second at its end."""
    return [0 if i == 0 else arena_bytes - size for i, size in enumerate(sizes)]


def overlaps(start: int, stop: int, other_start: int, other_stop: int) -> bool:
    return start < other_stop and other_start < stop
