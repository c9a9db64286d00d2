"""The RoPE + KV-write kernel summing a parts-out QKV GEMM's parts (kernels/parts_rotary.py):
bit for bit the ticket path of the same config followed by the plain rotary kernel
(rotary.rotate_and_write_kv): q out, the K and V pools; one small case under the Triton
interpreter, the registered candidates at the 8B's QKV shape on CUDA."""
import pytest
import torch

from parashift.kernels import dense_gemm_tma, fp8_gemm, rotary, split_parts_choice, \
    split_parts_rotary_choice
from parashift.kernels.dense_gemm_tma import Config as DenseConfig
from parashift.kernels.parts_rotary import rotate_parts_and_write_kv
from tests.kernels.common import case_tests, cuda
from tests.kernels.test_fp8_gemm import operands
from tests.kernels.test_rotary import rotary_embedding

# K split in 3 (a part past K's end at k 80: steps of 32), partial row and column tiles;
# the FP8 kernel with row tiles of 16 tokens (the interpreter's w8a8 limit)
SMALL_DENSE = (DenseConfig(64, 16, 32, 4, 2, 3),)
SMALL_FP8 = (fp8_gemm.Config("tma_w8a8", 64, 32, 4, 2, 3, max_block_m=16),)
CASES = [dict(m=20, q_heads=4, k_heads=2, head_dim=16, k=80)]
BLOCK_SIZE = 4


def check(m, q_heads, k_heads, head_dim, k, dtype="float32", device="cpu",
          dense_configs=SMALL_DENSE, fp8_configs=SMALL_FP8):
    n = (q_heads + 2 * k_heads) * head_dim
    x, w8, scale, _, _ = operands(m, n, k, False, dtype, device)
    dense_w = (torch.randn(n, k, generator=torch.Generator().manual_seed(2)) * k ** -0.5).to(
        device=device, dtype=x.dtype)
    cos_sin = rotary_embedding(head_dim, device).cos_sin
    gen = torch.Generator().manual_seed(3)
    positions = torch.randint(4096, (m,), generator=gen).to(device)
    blocks = (m + 2 + BLOCK_SIZE - 1) // BLOCK_SIZE
    slots = torch.randperm(blocks * BLOCK_SIZE, generator=gen)[:m]
    slots[-2:] = -1  # padding rows: not written
    slots = slots.to(device)
    pool_shape = (blocks, BLOCK_SIZE, k_heads, head_dim)

    def plain(y):
        k_cache, v_cache = (torch.zeros(pool_shape, dtype=x.dtype, device=device)
                            for _ in range(2))
        q, kk, v = y.unflatten(-1, (-1, head_dim)).split([q_heads, k_heads, k_heads], dim=-2)
        q_out = rotary.rotate_and_write_kv(positions, q, kk, v, cos_sin, k_cache, v_cache,
                                           slots)
        return q_out, k_cache, v_cache

    def summed(parts, w_scale, x_scale):
        k_cache, v_cache = (torch.zeros(pool_shape, dtype=x.dtype, device=device)
                            for _ in range(2))
        q_out = rotate_parts_and_write_kv(positions, parts, w_scale, x_scale, q_heads,
                                          x.dtype, cos_sin, k_cache, v_cache, slots)
        return q_out, k_cache, v_cache

    for config in dense_configs:
        expected = plain(dense_gemm_tma.tma_linear(x, dense_w, None, config))
        assert_same(summed(dense_gemm_tma.tma_parts(x, dense_w, config), None, None),
                    expected, config)
    xq, x_scale = fp8_gemm.quantize_rows(x)
    for config in fp8_configs:
        ticket = fp8_gemm.fp8_weight_linear(
            x, w8, scale, None, fp8_gemm.Config(**{**config.__dict__, "tickets": True}),
            (xq, x_scale))
        parts = split_parts_choice.parts_of(x, w8, scale, config, (xq, x_scale))
        assert_same(summed(*parts), plain(ticket), config)


def assert_same(actual, expected, config):
    for got, want in zip(actual, expected, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape, config
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), config
    assert expected[1].abs().sum() > 0, "no k written: the check would pass on nothing"


test_interpreted, _ = case_tests(__name__, check, CASES, uses_dot=True,
                                 variants_in_one_dtype=True)


@cuda
@pytest.mark.parametrize("m", [40, 64])
def test_candidates_at_the_8b_qkv_shape_equal_the_ticket_path(m):
    """The registered candidates at the 8B's QKV [6144, 4096] (32 q heads, 8 KV heads of 128),
    bf16 activations."""
    check(m, 32, 8, 128, 4096, "bfloat16", "cuda", split_parts_rotary_choice.DENSE_CONFIGS,
          split_parts_rotary_choice.FP8_CONFIGS)


@cuda
def test_odd_shape_with_partial_tiles_equals_the_ticket_path():
    check(37, 6, 2, 64, 320, "bfloat16", "cuda", split_parts_rotary_choice.DENSE_CONFIGS,
          split_parts_rotary_choice.FP8_CONFIGS)
