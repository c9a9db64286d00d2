"""The Triton attention backend on the CPU, under the Triton interpreter (the first case in
float32 and float16, each later one in one of them, in turn), against the torch reference:
the same kernels the GPU compiles, so CI covers them. The compiled, bf16 and CUDA-graph
cases are in test_triton_backend.py."""
import os

import pytest
import torch

from parashift.attention import triton_backend
from parashift.attention.metadata import AttentionMetadata
from parashift.attention.torch_ref import TorchAttentionBackend
from tests.attention.test_triton_backend import make_step, run
from tests.kernels.common import (case_id, interpreted, interpreted_result,
                                  interpreter_cases, interpreter_runs_dot)

pytestmark = interpreter_runs_dot

# num_splits forces the split-KV count; static: the metadata of a CUDA-graph step, whose
# padding rows only the device knows (with splits the reduction must zero them)
CASES = [
    dict(q_lens=[1, 5, 1, 20], seq_lens=[40, 70, 200, 20], pad_tokens=3),
    # an FP8 pool, its values read as pairs (PARASHIFT_ATTN_FP8_PAIRS)
    dict(q_lens=[1] * 6, seq_lens=[1, 17, 100, 33, 64, 250], fp8_pairs=True),
    dict(q_lens=[48], seq_lens=[48]),
    dict(q_lens=[1, 30], seq_lens=[500, 90], num_splits=8),
    dict(q_lens=[1, 1, 1], seq_lens=[40, 300, 7], pad_tokens=5, static=True, num_splits=4),
    # more splits than the one-launch kernel takes: the split kernel, each row taking the
    # splits its context needs (1, 5, 1 of 16), its reduction merging those
    dict(q_lens=[1, 1, 1], seq_lens=[40, 300, 7], pad_tokens=5, static=True, num_splits=16),
    dict(q_lens=[1, 9], seq_lens=[33, 60], num_heads=8, num_kv_heads=1),
    dict(q_lens=[2, 1], seq_lens=[80, 19], num_heads=6, num_kv_heads=2, block_size=32),
    # a mixed-step graph's metadata: sequences padded apart from rows, one prefill launch
    dict(q_lens=[1, 1, 7, 20], seq_lens=[40, 300, 7, 50], pad_tokens=35, mixed_seqs=8),
    dict(q_lens=[1, 1, 7, 20], seq_lens=[40, 300, 7, 50], pad_tokens=35, mixed_seqs=8,
         num_splits=4),
]
DTYPES = ("float32", "float16")
TOLERANCE = {"float32": 1e-4, "float16": 2e-3}


def check(q_lens, seq_lens, dtype, num_heads=4, num_kv_heads=2, block_size=16, pad_tokens=0,
          static=False, num_splits=None, mixed_seqs=0, fp8_pairs=False):
    step = make_step(q_lens, seq_lens, num_heads, num_kv_heads, head_dim=32,
                     block_size=block_size, dtype=getattr(torch, dtype), pad_tokens=pad_tokens,
                     device="cpu")
    if fp8_pairs:  # the pool written, then held in E4M3; the reference reads it upcast
        os.environ[triton_backend.FP8_PAIRS_ENV] = "1"
        triton_backend.TritonAttentionBackend().write_kv(step.k, step.v, step.k_cache,
                                                         step.v_cache, step.meta)
        step.k_cache = step.k_cache.to(torch.float8_e4m3fn)
        step.v_cache = step.v_cache.to(torch.float8_e4m3fn)
        scale = step.q.shape[-1] ** -0.5
        expected = TorchAttentionBackend().attend(step.q, step.k_cache.to(step.q.dtype),
                                                  step.v_cache.to(step.q.dtype), step.meta,
                                                  scale)
        try:
            actual = triton_backend.TritonAttentionBackend().attend(
                step.q, step.k_cache, step.v_cache, step.meta, scale)
        finally:
            del os.environ[triton_backend.FP8_PAIRS_ENV]
        torch.testing.assert_close(actual, expected, atol=TOLERANCE[dtype],
                                   rtol=TOLERANCE[dtype])
        return
    expected = run(TorchAttentionBackend(), step)
    if static:
        step.meta = AttentionMetadata(**{**step.meta.__dict__, "static_shape": True})
    if mixed_seqs:
        step.meta = mixed_graph_metadata(step.meta, len(step.q), mixed_seqs)
    chooser = triton_backend.choose_num_splits
    if num_splits is not None:
        triton_backend.choose_num_splits = lambda *args: num_splits
    try:
        actual = run(triton_backend.TritonAttentionBackend(), step)
    finally:
        triton_backend.choose_num_splits = chooser
    torch.testing.assert_close(actual, expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def mixed_graph_metadata(meta: AttentionMetadata, rows: int, seqs: int,
                         max_model_len: int = 512) -> AttentionMetadata:
    """`meta` as a mixed-step graph holds it (parashift/worker/cuda_graphs.py): padding
    sequences of no rows and no context, host lists that describe the bucket, not the step."""
    pad = seqs - meta.num_seqs
    tables = meta.block_tables
    tables = torch.cat((tables, tables.new_zeros(pad, tables.shape[1])))
    return AttentionMetadata(
        slot_mapping=meta.slot_mapping,
        query_start_loc=torch.cat((meta.query_start_loc,
                                   meta.query_start_loc[-1:].repeat(pad))),
        seq_lens=torch.cat((meta.seq_lens, meta.seq_lens.new_zeros(pad))), block_tables=tables,
        query_start_loc_cpu=[0] + [rows] * seqs, seq_lens_cpu=[max_model_len] * seqs,
        max_query_len=rows, max_seq_len=max_model_len, block_size=meta.block_size,
        static_shape=True)


def check_warm_up(dtype):
    step = make_step([1], [16], head_dim=32, dtype=getattr(torch, dtype), device="cpu")
    launches = triton_backend.TritonAttentionBackend().warm_up(8, step.k_cache, step.v_cache,
                                                               step.q.dtype)
    assert launches == 2 * triton_backend.MAX_SPLITS.bit_length()


ALL = interpreter_cases(CASES, variants_in_one_dtype=True)


# one child process runs every case of a check (in the background from the session's start)
@pytest.mark.parametrize("i", range(len(ALL)), ids=[case_id(c) for c in ALL])
@interpreted(__name__, "check", ALL)
def test_matches_reference(i):
    interpreted_result(__name__, "check", i)


@pytest.mark.parametrize("i", range(len(DTYPES)), ids=DTYPES)
@interpreted(__name__, "check_warm_up", [{"dtype": d} for d in DTYPES])
def test_warm_up_launches_every_variant(i):
    interpreted_result(__name__, "check_warm_up", i)
