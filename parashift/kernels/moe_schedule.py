"""How the prefill path's grouped GEMMs (kernels/moe_prefill.py's gate_up, kernels/fused_moe.py's
down) walk their tiles, switched by the prefill tiles' flags (moe_prefill.TILES, the sweep's
file); all off: the decode path's walk, unchanged.

- n_first: the column tiles of one row block run next to each other (grid (column tiles,
  blocks)): a block's gathered activation rows are read from memory once and stay in L2 for
  its other column tiles, and an expert's weights are read by its blocks at about the same
  time. Off: the blocks of one column tile run next to each other and every column tile
  reads the whole gathered activations again.
- split_tail: a block whose second half holds no pair (an expert's last rows, the run padded
  to a multiple of block_m) runs a GEMM of half the rows: 128-row blocks pad ~27% of a
  4,096-token Qwen3-30B-A3B layer's rows, half blocks at the tail ~13%.
- tma: the weights by a TMA descriptor of their [E * n, k] view (16-bit weights of the
  activations' dtype, stored whole: not a narrowed layout's strided view, not FP8).
- joint (gate_up only, where tma could run): a column tile's gate and up rows in one TMA load
  of the [E * 2, I, H] view and one GEMM of twice the columns (a wider MMA reads the shared
  activations from shared memory once for both), the sums split after the loop."""
import torch
import triton
import triton.language as tl

FLAGS = ("n_first", "split_tail", "tma", "joint")
MAX_GRID_Y = 65535  # CUDA's limit on the grid's second dimension


@triton.jit
def block_and_column_tile(N_FIRST: tl.constexpr):
    """(row block, column tile) of this program."""
    if N_FIRST:
        return tl.program_id(1), tl.program_id(0)
    return tl.program_id(0), tl.program_id(1)


@triton.jit
def tail_block(pair_ptr, block, num_pairs, BLOCK_M: tl.constexpr):
    """The block's second half holds no pair (an expert's pairs come first in its run)."""
    return tl.load(pair_ptr + block * BLOCK_M + BLOCK_M // 2) >= num_pairs


def flags(tiles: dict) -> dict:
    """{flag: 0 or 1} of the prefill tiles (a missing flag is 0)."""
    return {name: int(tiles.get(name, 0)) for name in FLAGS}


def check_flags(tiles: dict) -> None:
    bad = {name: tiles[name] for name in FLAGS if name in tiles and tiles[name] not in (0, 1)}
    if bad:
        raise ValueError(f"MoE prefill schedule flags must be 0 or 1, got {bad}")


def grid(blocks: int, column_tiles: int, n_first: int) -> tuple[tuple[int, int], int]:
    """(the launch grid, the N_FIRST the kernel takes): n_first where the blocks fit the
    grid's second dimension."""
    if n_first and blocks <= MAX_GRID_Y:
        return (column_tiles, blocks), 1
    return (blocks, column_tiles), 0


def weight_descriptor(w: torch.Tensor, activations: torch.Tensor, block_n: int, block_k: int,
                      wanted: int, parts: int = 1):
    """A TMA descriptor of the stacked weights w [E, n, k] as [E * n, k] with [block_n,
    block_k] tiles (parts 2: as [E * 2, n / 2, k] with [2, block_n, block_k] tiles, a
    column tile of both halves), where `wanted` and the weights allow it; else None."""
    if not wanted or w.dim() != 3 or not w.is_contiguous() or w.dtype != activations.dtype:
        return None
    from parashift.kernels.fp8_gemm_tma import fits, supported
    flat = w.view(-1, w.shape[2])
    if not supported(w.device) or not fits(flat) or w.shape[1] % parts:
        return None
    from triton.tools.tensor_descriptor import TensorDescriptor
    if parts == 1:
        return TensorDescriptor(flat, list(flat.shape), [flat.stride(0), 1], [block_n, block_k])
    view = w.view(w.shape[0] * parts, w.shape[1] // parts, w.shape[2])
    return TensorDescriptor(view, list(view.shape), [view.stride(0), view.stride(1), 1],
                            [parts, block_n, block_k])
