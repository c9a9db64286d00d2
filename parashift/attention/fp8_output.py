"""A request, from the layer around an attention call, for the attention's output rows in
E4M3 with their per-row scales (issue 60: o_proj's input, layers/fp8_attention_output.py).
The layer opens `requested()` around its call; a backend launch that can write the rows
beside the output (the Triton backend's unsplit one-launch decode over every row,
triton_decode_fp8_out.py) takes `pending()` and records what it made; any other launch leaves
it empty, and the layer after quantizes its input itself."""
import contextlib
from typing import Iterator

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # as fp8_gemm.quantize_rows's

class OutputRows:
    """What one attention call made for the layer after it, or nothing."""

    def __init__(self):
        self.made: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def record(self, out: torch.Tensor, rows: torch.Tensor, scales: torch.Tensor) -> None:
        """out [tokens, heads, head_dim]; rows [tokens, heads * head_dim] E4M3 and scales
        [tokens, 1] fp32: `fp8_gemm.quantize_rows(out.flatten(-2))`."""
        self.made = (out, rows, scales)


_pending: OutputRows | None = None


@contextlib.contextmanager
def requested() -> Iterator[OutputRows]:
    """A request open for the attention calls inside the context (one layer's)."""
    global _pending
    request = _pending = OutputRows()
    try:
        yield request
    finally:
        _pending = None


def pending() -> OutputRows | None:
    """The open request, taken: the first decode launch to ask answers it or no one does."""
    global _pending
    request, _pending = _pending, None
    return request
