"""The FP8 x FP8 TMA GEMM at 16-64 rows with its work cut evenly among a grid of programs
("stream-K", issue 60).

`fp8_gemm_tma.py`'s kernel gives each program one output tile (or one part of K of it): at
64 rows the 8B's projections make 64-128 such programs (N / 64 or N / 256 weight rows a
tile), so up to half of an H200's 132 SMs stream nothing while the others read a whole
slice. Here the (output tile, K step) iterations, tile after tile, are cut into as many
equal runs as programs (one an SM by default): a program reads its run, finishing each
output tile it holds whole and storing its share of the one or two it holds in part. A tile
held in parts is finished by the last of its programs to take the tile's ticket
(split_tickets.py), which sums the shares in program order: the same bits whatever order the
programs ran in, but not those of a tile summed in one run (other partial sums). On one H200
at 64 rows it was slower at every 8B projection than the one-tile-a-program kernel (e.g. qkv
14.1 against 9.9 µs, gate_up 39.6 against 34.1; docs/benchmark_log.md, helper fp8q): no
candidate of the engine's choice, kept for `benchmarks/fp8_gemm_sweep.py --kernels sk`."""
import torch
import triton
import triton.language as tl

from parashift.kernels import num_sms, pdl, split_tickets
from parashift.kernels.fp8_epilogue import OFF, finish_tile, tile_scales

KERNEL = "tma_w8a8_sk"  # fp8_gemm.Config.kernel


@triton.jit
def _owner(iteration, programs, total):
    """The program whose run holds `iteration` (runs: program p's from p * total // programs)."""
    return ((iteration + 1) * programs + total - 1) // total - 1


@triton.jit
def _share(part_ptr, program, tile, programs, total, k_steps, BLOCK_N: tl.constexpr,
           BLOCK_M: tl.constexpr):
    """Where `program` stores its share of `tile`: its first slot for the first tile of its run,
    its second for the last (no run holds a third tile in part)."""
    first_tile = (program * total // programs) // k_steps
    slot = 2 * program + (tile != first_tile).to(tl.int32)
    offs = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
    return part_ptr + slot.to(tl.int64) * (BLOCK_N * BLOCK_M) + offs


@triton.jit
def _fp8_streamk_kernel(x_desc, xs_ptr, w_desc, w_ptr, stride_wn, s_ptr, b_ptr, y_ptr,
                        part_ptr, counter_ptr, M, N, K, stride_ym, HAS_BIAS: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        NUM_STAGES: tl.constexpr, USE_PDL: tl.constexpr,
                        PREFETCH_K: tl.constexpr):
    program, programs = tl.program_id(0), tl.num_programs(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    total = tiles_n * tl.cdiv(M, BLOCK_M) * k_steps
    start, end = program * total // programs, (program + 1) * total // programs
    pdl.start_streaming(w_ptr, stride_wn, N, K, (start // k_steps % tiles_n) * BLOCK_N,
                        (start % k_steps) * BLOCK_K, BLOCK_N, PREFETCH_K, USE_PDL)
    iteration = start
    while iteration < end:
        tile = iteration // k_steps
        k_first = iteration - tile * k_steps
        k_end = tl.minimum(end - tile * k_steps, k_steps)
        first_n, first_m = (tile % tiles_n) * BLOCK_N, (tile // tiles_n) * BLOCK_M
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for step in tl.range(k_first, k_end, num_stages=NUM_STAGES):
            w = w_desc.load([first_n, step * BLOCK_K])
            x = x_desc.load([first_m, step * BLOCK_K])
            acc = tl.dot(w, tl.trans(x), acc)
        offs_m = first_m + tl.arange(0, BLOCK_M)
        offs_n = first_n + tl.arange(0, BLOCK_N)
        m_ok, n_ok = offs_m < M, offs_n < N
        scales = tile_scales(xs_ptr, s_ptr, b_ptr, offs_m, offs_n, m_ok, n_ok, HAS_BIAS, True)
        if (k_first == 0) & (k_end == k_steps):
            finish_tile(tl.trans(acc), scales, y_ptr, offs_m, offs_n, m_ok, n_ok, stride_ym,
                        True, HAS_BIAS, True, False, OFF)
        else:
            tl.store(_share(part_ptr, program, tile, programs, total, k_steps, BLOCK_N,
                            BLOCK_M), acc)
            first = _owner(tile * k_steps, programs, total)
            last = _owner(tile * k_steps + k_steps - 1, programs, total)
            if split_tickets.is_last_of(counter_ptr + tile, last - first + 1):
                split_tickets.reset(counter_ptr + tile)
                summed = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
                for owner in range(first, last + 1):
                    summed += tl.load(_share(part_ptr, owner, tile, programs, total, k_steps,
                                             BLOCK_N, BLOCK_M), cache_modifier=".cg")
                finish_tile(tl.trans(summed), scales, y_ptr, offs_m, offs_n, m_ok, n_ok,
                            stride_ym, True, HAS_BIAS, True, False, OFF)
        iteration = tile * k_steps + k_end
    pdl.inputs_read(USE_PDL)


def streamk_linear(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
                   scale: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype,
                   block_n: int, block_k: int, num_warps: int, num_stages: int,
                   programs: int = 0) -> torch.Tensor:
    """y [M, N] in out_dtype = (xq * x_scale) (weight * scale)^T + bias, xq [M, K] E4M3 with
    x_scale [M, 1] fp32 (per token), over `programs` programs (0: one an SM; at most one
    a (tile, K step) iteration)."""
    from parashift.kernels import fp8_gemm_tma
    if block_k > fp8_gemm_tma.MAX_BLOCK_K or not fp8_gemm_tma.fits(weight):
        raise ValueError(f"the stream-K FP8 GEMM takes BLOCK_K <= {fp8_gemm_tma.MAX_BLOCK_K} "
                         f"and a weight with 16-byte aligned rows, got BLOCK_K {block_k}, "
                         f"weight {tuple(weight.shape)} strides {weight.stride()}")
    xq = xq if fp8_gemm_tma.fits(xq) else xq.clone(memory_format=torch.contiguous_format)
    (m, k), n = xq.shape, weight.shape[0]
    bm = fp8_gemm_tma.block_m(m)
    tiles = triton.cdiv(n, block_n) * triton.cdiv(m, bm)
    counters = split_tickets.counters(xq.device, tiles)
    if counters is None:
        raise ValueError(f"the stream-K FP8 GEMM's {tiles} tiles take more tickets than "
                         f"split_tickets holds, or its counters are not made yet")
    # at most a program an iteration: then no run is empty (each holds >= 1 of them)
    grid = min(programs or num_sms(xq.device), tiles * triton.cdiv(k, block_k))
    y = torch.empty(m, n, dtype=out_dtype, device=xq.device)
    parts = torch.empty(2 * grid, block_n, bm, dtype=torch.float32, device=xq.device)
    from triton.tools.tensor_descriptor import TensorDescriptor
    x_desc = TensorDescriptor(xq, [m, k], [xq.stride(0), 1], [bm, block_k])
    w_desc = TensorDescriptor(weight, list(weight.shape), [weight.stride(0), 1],
                              [block_n, block_k])
    options = pdl.launch_options(xq.device)
    options["PREFETCH_K"] = (pdl.prefetch_cols(block_n, k, 1, fp8_gemm_tma.prefetch_bytes())
                             if options["USE_PDL"] else 0)
    _fp8_streamk_kernel[(grid,)](
        x_desc, x_scale, w_desc, weight, weight.stride(0), scale.reshape(-1),
        bias if bias is not None else scale, y, parts, counters, m, n, k, y.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=bm, BLOCK_N=block_n, BLOCK_K=block_k,
        NUM_STAGES=num_stages, num_warps=num_warps, **options)
    return y
