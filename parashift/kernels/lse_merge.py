"""Two partial attention outputs of the same query rows over disjoint key ranges, merged
by their log-sum-exps in one pass: out = (a * e^(lse_a - m) + b * e^(lse_b - m)) / (e^(lse_a -
m) + e^(lse_b - m)), m the larger LSE, in fp32, rounded once to the output's dtype.

The partials are read where the attention calls left them: each as a [rows, kv_heads,
group, d] view (its LSE [rows, kv_heads, group]) of any strides, so that a KV head's query
heads packed as rows of one head and a plain [heads, rows, d] output need no copy first.
A program merges one row's heads; `merge_torch` is the reference (and the CPU path)."""
import torch
import triton
import triton.language as tl


@triton.jit
def _lse_merge_kernel(out_ptr, a_ptr, la_ptr, b_ptr, lb_ptr, heads, group,
                      a_t, a_kv, a_g, a_d, la_t, la_kv, la_g,
                      b_t, b_kv, b_g, b_d, lb_t, lb_kv, lb_g, head_dim,
                      D_P: tl.constexpr, BLOCK_H: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, D_P)
    h_mask = h < heads
    kv, g = h // group, h % group
    la = tl.load(la_ptr + row * la_t + kv * la_kv + g * la_g, mask=h_mask, other=0.0)
    lb = tl.load(lb_ptr + row * lb_t + kv * lb_kv + g * lb_g, mask=h_mask, other=0.0)
    m = tl.maximum(la, lb)
    wa, wb = tl.exp(la - m), tl.exp(lb - m)
    total = wa + wb
    mask = h_mask[:, None] & (d[None, :] < head_dim)
    a = tl.load(a_ptr + row * a_t + (kv * a_kv + g * a_g)[:, None] + d[None, :] * a_d,
                mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + row * b_t + (kv * b_kv + g * b_g)[:, None] + d[None, :] * b_d,
                mask=mask, other=0.0).to(tl.float32)
    out = (a * (wa / total)[:, None] + b * (wb / total)[:, None])
    tl.store(out_ptr + row * heads * head_dim + h[:, None] * head_dim + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=mask)


def merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor,
          dtype: torch.dtype) -> torch.Tensor:
    """out_*: [rows, kv_heads, group, d] views, lse_*: [rows, kv_heads, group] (natural log)
    -> [rows, kv_heads * group, d] contiguous in `dtype`."""
    rows, kv_heads, group, d = out_a.shape
    if out_b.shape != out_a.shape or not lse_a.shape == lse_b.shape == out_a.shape[:3]:
        raise ValueError(f"partials of shapes {tuple(out_a.shape)} / {tuple(out_b.shape)}, "
                         f"LSEs {tuple(lse_a.shape)} / {tuple(lse_b.shape)} do not match")
    heads = kv_heads * group
    out = torch.empty(rows, heads, d, dtype=dtype, device=out_a.device)
    if rows == 0:
        return out
    d_p = triton.next_power_of_2(d)
    block_h = min(triton.next_power_of_2(heads), max(1, 4096 // d_p))  # <= 4,096 values
    grid = (rows, triton.cdiv(heads, block_h))
    _lse_merge_kernel[grid](out, out_a, lse_a, out_b, lse_b, heads, group,
                            *out_a.stride(), *lse_a.stride(), *out_b.stride(), *lse_b.stride(),
                            d, D_P=d_p, BLOCK_H=block_h, num_warps=4)
    return out


def merge_torch(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                lse_b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`merge` in PyTorch operations."""
    lse = torch.logaddexp(lse_a.float(), lse_b.float())
    out = (out_a.float() * (lse_a - lse).exp().unsqueeze(-1)
           + out_b.float() * (lse_b - lse).exp().unsqueeze(-1))
    return out.flatten(1, 2).to(dtype)
