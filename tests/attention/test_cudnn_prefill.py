"""The cuDNN prefill route: which sequences take it (host logic, any device), and its output
against the torch reference and the Triton kernel on a CUDA device."""
import dataclasses

import numpy as np
import pytest
import torch

from parashift.attention.metadata import AttentionMetadata

pytest.importorskip("triton")
from parashift.attention import triton_backend  # noqa: E402
from parashift.attention import cudnn_chunk  # noqa: E402
from parashift.attention.cudnn_prefill import (CudnnPrefillAttentionBackend, _context,  # noqa: E402
                                               block_run)
from parashift.attention.torch_ref import TorchAttentionBackend  # noqa: E402


def host_meta(q_lens, seq_lens) -> AttentionMetadata:
    starts = [0]
    for q_len in q_lens:
        starts.append(starts[-1] + q_len)
    empty = torch.zeros(0)
    return AttentionMetadata(slot_mapping=empty, query_start_loc=empty, seq_lens=empty,
                             block_tables=empty, query_start_loc_cpu=starts,
                             seq_lens_cpu=list(seq_lens), max_query_len=max(q_lens),
                             max_seq_len=max(seq_lens), block_size=16)


def routes(backend, meta) -> dict[int, str]:
    return {seq: route.__name__ for seq, route in backend._routes(meta, torch.device("cpu")).items()}


@pytest.mark.parametrize("chunks_run", [True, False])
def test_long_prompts_and_long_chunks_of_long_contexts_take_cudnn(monkeypatch, chunks_run):
    monkeypatch.setattr(cudnn_chunk, "available", lambda device_index: chunks_run)
    meta = host_meta([1, 1, 5000, 4096, 6000, 4095, 2048, 2047, 3000, 1],
                     [700, 9, 5000, 4096, 7000, 4095, 8192, 9000, 12000, 2])
    # a prompt one token short, a chunk one token short and a chunk of a context under
    # 8,192 tokens stay with Triton; chunks only where cuDNN's call with its LSE runs
    chunks = {6: "_chunk_after_prefix", 8: "_chunk_after_prefix"} if chunks_run else {}
    assert routes(CudnnPrefillAttentionBackend(), meta) == {
        2: "_causal_prompt", 3: "_causal_prompt"} | chunks
    assert routes(CudnnPrefillAttentionBackend(long_prefill_tokens=4095), meta) == {
        2: "_causal_prompt", 3: "_causal_prompt", 5: "_causal_prompt"} | chunks
    assert routes(CudnnPrefillAttentionBackend(chunk_tokens=1), host_meta([1], [9000])) == (
        {0: "_chunk_after_prefix"} if chunks_run else {})


def ranges(meta, num_tokens, first=0, end=None):
    return [(r.first, r.end, r.token_offset, r.num_tokens, r.decode)
            for r in triton_backend._split_decodes(meta, num_tokens, first, end)]


def test_split_decodes_of_a_part_of_the_batch():
    meta = host_meta([1, 1, 300, 1, 77, 1, 1], [5, 9, 300, 40, 100, 3, 4])
    # the whole batch: leading decodes, then the rest (padding rows to the last)
    assert ranges(meta, 390) == [(0, 2, 0, 2, True), (2, 7, 2, 388, False)]
    # a part: its own leading decodes, rows up to the next part's first
    assert ranges(meta, 390, 3, 5) == [(3, 4, 302, 1, True), (4, 5, 303, 77, False)]
    assert ranges(meta, 390, 5, 7) == [(5, 7, 380, 2, True)]
    assert ranges(meta, 390, 4, 7) == [(4, 7, 303, 87, False)]
    assert ranges(meta, 390, 0, 1) == [(0, 1, 0, 1, True)]


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(32, 8, 128), (8, 8, 64),
                                                             (12, 4, 128)])
def test_mixed_batch_matches_the_reference(num_heads, num_kv_heads, head_dim):
    from tests.attention.test_triton_backend import TOLERANCE, make_step, run
    q_lens = [1, 1, 4200, 300, 1, 5000, 700, 4097, 2100, 2048, 1]
    seq_lens = [900, 7000, 4200, 1300, 1, 5000, 700, 4097 + 64, 2100 + 8000, 8192 + 2048, 9]
    step = make_step(q_lens, seq_lens, num_heads, num_kv_heads, head_dim, pad_tokens=3)
    backend = CudnnPrefillAttentionBackend()
    assert {s: r.__name__ for s, r in backend._routes(step.meta, step.q.device).items()} == {
        2: "_causal_prompt", 5: "_causal_prompt", 8: "_chunk_after_prefix",
        9: "_chunk_after_prefix"}
    expected = run(TorchAttentionBackend(), step)
    actual = run(backend, step)
    tol = TOLERANCE[step.q.dtype]
    torch.testing.assert_close(actual, expected, atol=tol, rtol=tol)
    assert actual[sum(q_lens):].eq(0).all()


@cuda
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("q_len,prefix", [(2048, 8192), (2500, 6000), (3000, 512 * 13 + 7),
                                          (2100, 300)])
def test_a_chunk_after_a_prefix(monkeypatch, q_len, prefix, fused):
    """The cut below the prefix's end at 8,192, 5,632, 6,656 and 0 keys (rem 0, 368, 7, 300);
    fused: the merge kernel and GQA in the causal call (the default), else K and V repeated
    and the merge in PyTorch."""
    from tests.attention.test_triton_backend import TOLERANCE, make_step, run
    monkeypatch.setattr(cudnn_chunk, "FUSED_MERGE", fused)
    monkeypatch.setattr(cudnn_chunk, "NATIVE_GQA", fused)
    if fused:
        assert cudnn_chunk.gqa_available(0)  # PyTorch 2.11's cuDNN call takes GQA
    step = make_step([q_len], [prefix + q_len], 32, 8)
    expected = run(TorchAttentionBackend(), step)
    actual = run(CudnnPrefillAttentionBackend(chunk_context=1), step)
    tol = TOLERANCE[step.q.dtype]
    torch.testing.assert_close(actual, expected, atol=tol, rtol=tol)


@cuda
def test_a_batch_of_only_long_prompts():
    from tests.attention.test_triton_backend import TOLERANCE, make_step, run
    step = make_step([4096, 4603], [4096, 4603], 16, 4)
    expected = run(TorchAttentionBackend(), step)
    actual = run(CudnnPrefillAttentionBackend(long_prefill_tokens=4096), step)
    tol = TOLERANCE[step.q.dtype]
    torch.testing.assert_close(actual, expected, atol=tol, rtol=tol)


@cuda
def test_an_fp8_pool_matches_the_triton_kernel():
    """kv_cache_dtype fp8: the cuDNN routes read the E4M3 pool as the Triton kernel does."""
    from parashift.attention.triton_backend import TritonAttentionBackend
    from tests.attention.test_triton_backend import TOLERANCE, make_step, run
    step = make_step([4200, 1, 300, 2048], [4200, 900, 1300, 8192 + 2048], 32, 8)
    pools = [c.to(torch.float8_e4m3fn) for c in (step.k_cache, step.v_cache)]
    backend = CudnnPrefillAttentionBackend()
    assert sorted(backend._routes(step.meta, step.q.device)) == [0, 3]
    expected = run(TritonAttentionBackend(), step, *(p.clone() for p in pools))
    actual = run(backend, step, *(p.clone() for p in pools))
    tol = TOLERANCE[step.q.dtype]
    torch.testing.assert_close(actual, expected, atol=tol, rtol=tol)


def math_with_lse(q, k, v, causal: bool, scale: float):
    """_with_lse in PyTorch math on the CPU, its output in cuDNN's layout for q's (BSHD)."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1).float() for t in (k, v))
    scores = q.float() @ k.transpose(-1, -2) * scale
    if causal:
        scores.masked_fill_(torch.ones_like(scores, dtype=torch.bool).triu(1), -float("inf"))
    out = (scores.softmax(-1) @ v).to(q.dtype).transpose(1, 2).contiguous().transpose(1, 2)
    return out[0], scores.logsumexp(-1)[0]


@pytest.mark.parametrize("gqa", [True, False])
@pytest.mark.parametrize("n,prefix", [(5, 13), (6, 0), (3, 16), (9, 2)])
def test_the_chunk_routes_views_and_merge_on_the_cpu(monkeypatch, n, prefix, gqa):
    """chunk_attention's bookkeeping (the cut, the discarded rows, the packed heads, the
    views the merge reads) with cuDNN's call replaced by PyTorch math, 8-token pads."""
    monkeypatch.setattr(cudnn_chunk, "PAD_TOKENS", 8)
    monkeypatch.setattr(cudnn_chunk, "_with_lse", math_with_lse)
    monkeypatch.setattr(cudnn_chunk, "FUSED_MERGE", False)  # the kernel: tests/kernels
    monkeypatch.setattr(cudnn_chunk, "NATIVE_GQA", gqa)
    monkeypatch.setattr(cudnn_chunk, "gqa_available", lambda device_index: True)
    gen = torch.Generator().manual_seed(n + prefix)
    q = torch.randn(n, 6, 8, generator=gen)
    k, v = (torch.randn(prefix + n, 2, 8, generator=gen) for _ in range(2))
    positions = torch.arange(prefix, prefix + n)[:, None]
    mask = torch.arange(prefix + n)[None, :] <= positions  # [n, keys]
    scores = torch.einsum("qhd,khd->hqk", q, k.repeat_interleave(3, dim=1)) * 0.3
    expected = torch.einsum("hqk,khd->qhd", scores.masked_fill(~mask, -float("inf")).softmax(-1),
                            v.repeat_interleave(3, dim=1))
    actual = cudnn_chunk.chunk_attention(q, k, v, 0.3)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_rows_are_padded_only_where_missing():
    x = torch.randn(6, 2, 4)
    assert cudnn_chunk.pad_rows(x, 6) is x  # no copy
    before = cudnn_chunk.pad_rows(x, 9, before=1)
    assert before.shape == (9, 2, 4) and torch.equal(before[1:7], x)
    assert not before[0].any() and not before[7:].any()
    padded = cudnn_chunk.pad_rows(x, 8)
    assert padded.shape == (8, 2, 4) and torch.equal(padded[:6], x)
    assert not padded[6:].any()


def test_a_context_whose_blocks_are_one_run_is_a_view_of_the_pool():
    meta = dataclasses.replace(host_meta([40, 40, 20], [40, 40, 20]), block_tables_cpu=np.array(
        [[3, 4, 5], [7, 6, 8], [9, 10, 0]], dtype=np.int32))
    # 40 tokens of 16 a block: 3 blocks; 20: 2 (the table's padding not read)
    assert [block_run(meta, seq) for seq in range(3)] == [slice(3, 6), None, slice(9, 11)]
    assert block_run(host_meta([40], [40]), 0) is None  # no host copy of the tables
    pool = torch.randn(12, 16, 2, 4)
    view = _context(pool, slice(3, 6), 40, pool.dtype)
    assert torch.equal(view, _context(pool, torch.tensor([3, 4, 5, 1]), 40, pool.dtype))
    assert view.data_ptr() == pool[3].data_ptr()  # no copy


@cuda
def test_a_prompt_whose_blocks_are_one_run_gives_the_gathered_bits():
    """One prompt, the whole step: its blocks as one run of the pool (read as a view, the
    output returned as cuDNN gives it) against the same prompt's blocks scattered."""
    from tests.attention.test_triton_backend import Step, make_step, run
    scattered = make_step([4196], [4196], 32, 8)
    blocks = scattered.meta.block_tables.shape[1]
    in_order = torch.arange(blocks, dtype=torch.int32, device="cuda")
    meta = dataclasses.replace(
        scattered.meta, block_tables=in_order[None], block_tables_cpu=in_order[None].cpu().numpy(),
        slot_mapping=torch.arange(4196, device="cuda"), derived={})
    run_step = Step(meta, scattered.q, scattered.k, scattered.v, scattered.k_cache,
                    scattered.v_cache)
    backend = CudnnPrefillAttentionBackend()
    assert block_run(meta, 0) == slice(0, blocks)
    expected = run(backend, scattered)
    actual = run(backend, run_step)
    assert actual.shape == expected.shape and actual.is_contiguous()
    assert torch.equal(actual, expected)
