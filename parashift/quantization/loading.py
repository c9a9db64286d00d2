"""Loading FP8 weights: quantizing a checkpoint's rows as a layer's loader places them,
and checking and shaping what an FP8 checkpoint holds."""
import torch

from parashift.lazy_tensor import LazySlice, as_tensor
from parashift.quantization.fp8 import quantize_rows

_FP8_NAMES = ("F8_E4M3", "float8_e4m3fn")


class QuantizingTarget:
    """Stands for an FP8 weight (and its scales) where a layer's loader copies checkpoint
    rows: `narrow` on rows narrows both, `copy_` quantizes the rows it is given (whole
    rows: every column of the checkpoint's) and writes them and their scales."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor):
        self.weight, self.scale = weight, scale
        self.shape = weight.shape

    @property
    def data(self) -> "QuantizingTarget":
        return self

    def narrow(self, dim: int, start: int, length: int) -> "QuantizingTarget":
        if dim != 0:
            raise ValueError("an FP8 weight is quantized by whole rows: narrow rows only")
        return QuantizingTarget(self.weight.narrow(0, start, length),
                                self.scale.narrow(0, start, length))

    def copy_(self, rows: torch.Tensor) -> None:
        if rows.shape != self.weight.shape:
            raise ValueError(f"shape mismatch: FP8 weight {tuple(self.weight.shape)} vs "
                             f"checkpoint rows {tuple(rows.shape)}")
        q, scale = quantize_rows(rows)
        self.weight.copy_(q)
        self.scale.copy_(scale)

    def copy_sharded(self, rows: torch.Tensor, rank: int, parts: int) -> None:
        """Whole rows quantized, then this rank's `rank`-th of `parts` column slices kept
        (a row-parallel shard): every rank gets the scales one device would."""
        q, scale = quantize_rows(rows)
        width = q.shape[1] // parts
        self.weight.copy_(q.narrow(1, rank * width, width))
        self.scale.copy_(scale)


def _dtype_name(loaded) -> str:
    if isinstance(loaded, LazySlice) and hasattr(loaded.source, "get_dtype"):
        return loaded.source.get_dtype()
    return str(getattr(loaded, "dtype", "")).removeprefix("torch.")


def check_serialized(loaded) -> None:
    """An FP8 checkpoint's weight must be stored as E4M3."""
    name = _dtype_name(loaded)
    if name and name not in _FP8_NAMES:
        raise ValueError(f"the checkpoint says its weights are fp8, but a linear weight is "
                         f"stored as {name}")


def scale_rows(loaded, rows: int) -> torch.Tensor:
    """A checkpoint's weight scale as [rows, 1] fp32: per channel ([rows] or [rows, 1]) or
    per tensor (one value, repeated)."""
    scale = as_tensor(loaded).float()
    if scale.numel() == 1:
        return scale.reshape(1, 1).expand(rows, 1).contiguous()
    if scale.numel() != rows:
        raise ValueError(f"a weight scale of shape {tuple(scale.shape)} fits neither per "
                         f"channel ({rows} rows) nor per tensor; block-wise fp8 not supported")
    return scale.reshape(rows, 1)
