"""The one-launch decode attention's output row in E4M3 with its scale, for the FP8 layer after
it (o_proj; issue 60; layers/fp8_attention_output.py): in an unsplit launch the row's programs
(one a KV head) each store their heads' output as before and take the row's ticket
(split_tickets.py); the row's last program reads the whole row back (from L2) and writes its
E4M3 values and fp32 scale as `fp8_gemm.quantize_rows` would of the same bf16 row, bit for bit
(the same loads, largest magnitude, scale and conversion: kernels/fp8_values.py). That saves
o_proj's own quantizing launch between the attention and its GEMM."""
import triton
import triton.language as tl

from parashift.kernels import split_tickets
from parashift.kernels.fp8_values import row_scale, to_fp8


@triton.jit
def quantize_row_when_last(out_ptr, rows_ptr, scales_ptr, counter_ptr, token, stride_ot,
                           programs, row_len, ROW_P: tl.constexpr, FP8_MAX: tl.constexpr):
    """After this program stored its part of the output row `token` (of `row_len` values,
    contiguous): takes the row's ticket (`programs` programs share the row); the last writes
    the row's E4M3 values at rows_ptr [token, :] and its scale at scales_ptr [token]."""
    if split_tickets.is_last_of(counter_ptr, programs):
        split_tickets.reset(counter_ptr)
        k = tl.arange(0, ROW_P)
        ok = k < row_len
        x = tl.load(out_ptr + token * stride_ot + k, mask=ok, other=0.0,
                    cache_modifier=".cg").to(tl.float32)
        scale = row_scale(tl.max(tl.abs(x), axis=0), FP8_MAX)
        to_fp8(x, scale, rows_ptr + token * row_len + k, ok, FP8_MAX)
        tl.store(scales_ptr + token, scale)
