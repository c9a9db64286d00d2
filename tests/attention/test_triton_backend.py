"""The Triton backend against the torch reference, on a CUDA device."""
from dataclasses import dataclass

import pytest
import torch

from parashift.attention.metadata import AttentionMetadata
from parashift.attention.torch_ref import TorchAttentionBackend

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
triton_backend = pytest.importorskip("parashift.attention.triton_backend")
TritonAttentionBackend = triton_backend.TritonAttentionBackend

TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 2e-3, torch.float32: 1e-3}


@dataclass
class Step:
    meta: AttentionMetadata
    q: torch.Tensor
    k: torch.Tensor        # this step's new keys, one row per query token
    v: torch.Tensor
    k_cache: torch.Tensor  # cached prefixes written; every other slot is NaN
    v_cache: torch.Tensor


def make_step(q_lens, seq_lens, num_heads=8, num_kv_heads=2, head_dim=128, block_size=16,
              dtype=torch.bfloat16, pad_tokens=0, seed=0, device="cuda") -> Step:
    """Sequence i has seq_lens[i] tokens of context, the last q_lens[i] new;
    its blocks are a random, non-contiguous part of the pool."""
    dev = torch.device(device)
    gen = torch.Generator(dev).manual_seed(seed)
    blocks = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks) + 5
    perm = torch.randperm(num_blocks, generator=gen, device=dev)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype, device=dev)
    v_cache = torch.full(shape, float("nan"), dtype=dtype, device=dev)
    tables = torch.zeros(len(seq_lens), max(blocks, default=1), dtype=torch.int32, device=dev)
    cached_slots, new_slots, used = [], [], 0
    for i, (q_len, seq_len) in enumerate(zip(q_lens, seq_lens)):
        table = perm[used:used + blocks[i]]
        used += blocks[i]
        tables[i, :blocks[i]] = table.int()
        pos = torch.arange(seq_len, device=dev)
        slots = table[pos // block_size] * block_size + pos % block_size
        cached_slots.append(slots[:seq_len - q_len])
        new_slots.append(slots[seq_len - q_len:])
    new_slots.append(torch.full((pad_tokens,), -1, dtype=torch.int64, device=dev))
    cached = torch.cat(cached_slots)
    for cache in (k_cache, v_cache):
        cache.view(-1, num_kv_heads, head_dim)[cached] = _randn(
            (len(cached), num_kv_heads, head_dim), dtype, gen)
    num_tokens = sum(q_lens) + pad_tokens
    starts = [0]
    for q_len in q_lens:
        starts.append(starts[-1] + q_len)
    meta = AttentionMetadata(
        slot_mapping=torch.cat(new_slots).long(),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
        block_tables=tables, query_start_loc_cpu=starts, seq_lens_cpu=list(seq_lens),
        max_query_len=max(q_lens, default=0), max_seq_len=max(seq_lens, default=0),
        block_size=block_size)
    kv_shape = (num_tokens, num_kv_heads, head_dim)
    return Step(meta, _randn((num_tokens, num_heads, head_dim), dtype, gen),
                _randn(kv_shape, dtype, gen), _randn(kv_shape, dtype, gen), k_cache, v_cache)


def _randn(shape, dtype, gen):
    return torch.randn(shape, generator=gen, device=gen.device).to(dtype)


def run(backend, step: Step, k_cache=None, v_cache=None) -> torch.Tensor:
    k_cache = step.k_cache.clone() if k_cache is None else k_cache
    v_cache = step.v_cache.clone() if v_cache is None else v_cache
    backend.write_kv(step.k, step.v, k_cache, v_cache, step.meta)
    return backend.attend(step.q, k_cache, v_cache, step.meta, step.q.shape[-1] ** -0.5)


def assert_matches_reference(step: Step):
    expected = run(TorchAttentionBackend(), step)
    actual = run(TritonAttentionBackend(), step)
    tol = TOLERANCE[step.q.dtype]
    torch.testing.assert_close(actual, expected, atol=tol, rtol=tol)


def random_lengths(n, low, high, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(low, high + 1, (n,), generator=gen).tolist()


@pytest.mark.parametrize("batch", [1, 7, 64, 256])
def test_decode(batch):
    seq_lens = random_lengths(batch, 1, 2048, seed=batch)
    seq_lens[0] = 1
    seq_lens[-1] = 4096 + 777
    assert_matches_reference(make_step([1] * batch, seq_lens, 32, 8, seed=batch))


def test_decode_long_context():
    assert_matches_reference(make_step([1, 1], [32768, 20000], 32, 8))


def test_prefill():
    q_lens = [1, 17, 300, 1000, 64]
    assert_matches_reference(make_step(q_lens, q_lens))


def test_mixed_decode_and_chunked_prefill():
    q_lens = [1, 200, 1, 0, 37, 1, 512]
    seq_lens = [900, 1000, 1, 50, 37, 5000, 512 + 96]
    assert_matches_reference(make_step(q_lens, seq_lens, pad_tokens=5))


def test_decodes_first_then_chunked_prefills():
    seq_lens = random_lengths(40, 1, 3000, seed=3)
    q_lens = [1] * 40 + [300, 1, 77]
    step = make_step(q_lens, seq_lens + [300 + 1000, 9, 77], 32, 8, pad_tokens=4)
    assert_matches_reference(step)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(8, 8), (12, 4), (16, 4), (32, 4)])
@pytest.mark.parametrize("decode", [True, False])
def test_gqa_ratios(num_heads, num_kv_heads, decode):
    if decode:
        q_lens, seq_lens = [1] * 5, [1, 15, 16, 17, 3000]
    else:
        q_lens, seq_lens = [1, 40, 130, 1], [700, 40, 130 + 300, 64]
    assert_matches_reference(make_step(q_lens, seq_lens, num_heads, num_kv_heads))


@pytest.mark.parametrize("dtype,head_dim,block_size", [
    (torch.float16, 64, 32), (torch.float32, 128, 16), (torch.bfloat16, 256, 16),
    (torch.bfloat16, 64, 32), (torch.bfloat16, 128, 32)])
@pytest.mark.parametrize("decode", [True, False])
def test_dtypes_head_dims_block_sizes(dtype, head_dim, block_size, decode):
    if decode:
        q_lens, seq_lens = [1] * 6, [1, 31, 32, 33, 999, 4500]
    else:
        q_lens, seq_lens = [1, 70, 3, 1], [100, 70 + 33, 3, 1]
    step = make_step(q_lens, seq_lens, 8, 2, head_dim, block_size, dtype, pad_tokens=2)
    assert_matches_reference(step)


@pytest.mark.parametrize("num_splits", [2, 8, 64])
def test_forced_splits_on_mixed_batch(monkeypatch, num_splits):
    monkeypatch.setattr(triton_backend, "choose_num_splits", lambda *args: num_splits)
    step = make_step([1, 100, 1, 20], [3000, 100, 2, 20 + 70], pad_tokens=3)
    assert_matches_reference(step)


def test_write_kv_matches_reference_on_strided_inputs():
    step = make_step([3, 1, 9], [3, 40, 20], pad_tokens=4)
    qkv = torch.cat([step.q.flatten(1), step.k.flatten(1), step.v.flatten(1)], dim=1)
    k = qkv[:, 8 * 128:10 * 128].view(step.k.shape)   # a strided view, as from a fused QKV
    v = qkv[:, 10 * 128:].view(step.v.shape)
    expected_k, expected_v = step.k_cache.clone(), step.v_cache.clone()
    TorchAttentionBackend().write_kv(k, v, expected_k, expected_v, step.meta)
    k_cache, v_cache = step.k_cache.clone(), step.v_cache.clone()
    TritonAttentionBackend().write_kv(k, v, k_cache, v_cache, step.meta)
    torch.testing.assert_close(k_cache, expected_k, atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(v_cache, expected_v, atol=0, rtol=0, equal_nan=True)


def test_padding_rows_give_zeros():
    step = make_step([2, 1], [10, 300], pad_tokens=6)
    out = run(TritonAttentionBackend(), step)
    assert torch.equal(out[3:], torch.zeros_like(out[3:]))


@pytest.mark.parametrize("num_splits", [1, 4])
def test_static_shape_padding_rows_give_zeros(monkeypatch, num_splits):
    """In a graph the padding rows are known on the device only: with splits the reduction
    zeroes them (no fill), without, a fill does. Poisoned memory shows a missed row."""
    monkeypatch.setattr(triton_backend, "choose_num_splits", lambda *args: num_splits)
    step = make_step([1, 1, 1], [40, 300, 7], pad_tokens=5)
    step.meta = AttentionMetadata(**{**step.meta.__dict__, "static_shape": True})
    poison = torch.full_like(step.q, float("nan"))
    del poison  # the caching allocator hands this block to the next tensor of its size
    out = run(TritonAttentionBackend(), step)
    assert torch.equal(out[3:], torch.zeros_like(out[3:]))


def test_cuda_graph_replay_with_new_lengths():
    backend = TritonAttentionBackend()
    first = make_step([1] * 8, [5, 900, 3000, 17, 1, 64, 2000, 100], 32, 8, seed=1)
    second = make_step([1] * 8, [4000, 1, 2, 700, 33, 1000, 16, 129], 32, 8, seed=2)
    num_blocks = max(first.k_cache.shape[0], second.k_cache.shape[0])
    width = max(first.meta.block_tables.shape[1], second.meta.block_tables.shape[1])
    static = _static_copy(first, num_blocks, width)
    run(backend, static, static.k_cache, static.v_cache)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(backend, static, static.k_cache, static.v_cache)
    _load_into(static, _static_copy(second, num_blocks, width))
    graph.replay()
    expected = run(TorchAttentionBackend(), second)
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)


def _static_copy(step: Step, num_blocks: int, width: int) -> Step:
    """The step with its pool grown to num_blocks and block tables to width."""
    def grow(cache):
        grown = torch.full((num_blocks, *cache.shape[1:]), float("nan"), dtype=cache.dtype,
                           device=cache.device)
        grown[:cache.shape[0]] = cache
        return grown
    tables = torch.zeros(step.meta.num_seqs, width, dtype=torch.int32, device="cuda")
    tables[:, :step.meta.block_tables.shape[1]] = step.meta.block_tables
    meta = AttentionMetadata(**{**step.meta.__dict__, "block_tables": tables,
                                "seq_lens": step.meta.seq_lens.clone(),
                                "slot_mapping": step.meta.slot_mapping.clone(),
                                "query_start_loc": step.meta.query_start_loc.clone()})
    return Step(meta, step.q.clone(), step.k.clone(), step.v.clone(), grow(step.k_cache),
                grow(step.v_cache))


def _load_into(static: Step, new: Step):
    for name in ("q", "k", "v", "k_cache", "v_cache"):
        getattr(static, name).copy_(getattr(new, name))
    for name in ("slot_mapping", "seq_lens", "block_tables", "query_start_loc"):
        getattr(static.meta, name).copy_(getattr(new.meta, name))


def _compiled_variants(kernels) -> int:
    """Compiled variants held by Triton's in-memory caches of `kernels`."""
    try:
        return sum(len(entry[0]) for k in kernels for entry in k.device_caches.values())
    except (AttributeError, TypeError, IndexError):
        pytest.skip("this Triton does not expose JITFunction.device_caches")


def test_warm_up_leaves_nothing_to_compile():
    """After warm_up, steps of any mix of decodes and prefills, context lengths and batch
    sizes launch only variants it compiled: no request waits for Triton's compiler."""
    from parashift.attention.triton_decode import decode_attention_kernel
    from parashift.attention.triton_decode_preload import preloaded_decode_kernel
    from parashift.attention.triton_kernels import paged_attention_kernel, reduce_splits_kernel
    kernels = (paged_attention_kernel, reduce_splits_kernel, decode_attention_kernel,
               preloaded_decode_kernel)
    backend = TritonAttentionBackend()
    first = make_step([1], [16], num_heads=8, num_kv_heads=2)
    assert backend.warm_up(8, first.k_cache, first.v_cache, first.q.dtype) == 12
    compiled = _compiled_variants(kernels)
    shapes = [([1] * 3, [17, 300, 5000]), ([1] * 37, [100] * 37), ([1, 1, 1, 9], [20, 4000, 33, 9]),
              ([1] * 5 + [70, 3], [64] * 5 + [70, 515]), ([300], [300]), ([2, 1], [900, 12])]
    for q_lens, seq_lens in shapes:
        run(backend, make_step(q_lens, seq_lens, num_heads=8, num_kv_heads=2))
    assert _compiled_variants(kernels) == compiled


def _graph_meta(meta: AttentionMetadata, graph_len: int) -> AttentionMetadata:
    """A decode graph's metadata: its split count chosen for graph_len tokens."""
    rows = meta.num_seqs
    return AttentionMetadata(**{**meta.__dict__, "query_start_loc_cpu": list(range(rows + 1)),
                                "seq_lens_cpu": [graph_len] * rows, "max_seq_len": graph_len,
                                "static_shape": True})


@pytest.mark.parametrize("variant", ["two-launch", "one-launch", "one-launch-heads-first",
                                     "one-launch-fp8-pairs", "preload"])
@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_decode_in_a_graph_for_a_longer_context(monkeypatch, variant, kv_dtype):
    """Decodes whose graph was captured for 32k tokens (32 splits) at contexts from one token
    up: the one-launch kernel (at any split count here) takes as many splits as each context
    needs, merges them in the split programs and zeroes the padding rows; so does the
    preloading split kernel (its splits of many tiles prefetched), merged by the reduction;
    FP8 pools read as their values (a byte at a time, PARASHIFT_ATTN_FP8_PAIRS=0;
    "one-launch-fp8-pairs": as 16-bit pairs, the products in fp16)."""
    monkeypatch.setenv(triton_backend.FUSED_REDUCE_ENV, "0" if variant == "two-launch" else "1")
    monkeypatch.setattr(triton_backend, "FUSED_HEADS_FIRST", variant.endswith("heads-first"))
    monkeypatch.setenv(triton_backend.FP8_PAIRS_ENV, "1" if variant.endswith("pairs") else "0")
    if variant.startswith("one-launch"):
        monkeypatch.setattr(triton_backend, "FUSED_MAX_SPLITS", triton_backend.MAX_SPLITS)
    monkeypatch.setattr(triton_backend, "choose_num_splits", lambda *args: 32)
    seq_lens = [1, 100, 129, 1024, 4096, 8191, 30000]
    step = make_step([1] * len(seq_lens), seq_lens, 32, 8, pad_tokens=3, seed=7)
    k_cache, v_cache = step.k_cache.clone(), step.v_cache.clone()
    TritonAttentionBackend().write_kv(step.k, step.v, k_cache, v_cache, step.meta)
    k_cache, v_cache = k_cache.to(kv_dtype), v_cache.to(kv_dtype)
    scale = step.q.shape[-1] ** -0.5
    expected = TorchAttentionBackend().attend(step.q, k_cache.to(step.q.dtype),
                                              v_cache.to(step.q.dtype), step.meta, scale)
    meta = _graph_meta(step.meta, 32768)
    backend = TritonAttentionBackend()
    poison = torch.full_like(step.q, float("nan"))
    del poison  # the caching allocator hands this block to the output
    actual = backend.attend(step.q, k_cache, v_cache, meta, scale)
    torch.testing.assert_close(actual, expected, atol=2e-2, rtol=2e-2)
    again = backend.attend(step.q, k_cache, v_cache, meta, scale)
    assert torch.equal(actual, again)  # the merge's order fixed: the same bits run to run


def test_fused_decode_graph_replays_reset_the_tickets(monkeypatch):
    """Replayed twice with new lengths, a captured one-launch decode gives the reference's
    rows both times (a ticket left behind would skip or double a row's merge)."""
    monkeypatch.setattr(triton_backend, "FUSED_MAX_SPLITS", triton_backend.MAX_SPLITS)
    backend = TritonAttentionBackend()
    first = make_step([1] * 4, [3000, 17, 900, 2], 32, 8, seed=3)
    second = make_step([1] * 4, [5, 2500, 600, 3900], 32, 8, seed=4)
    num_blocks = max(first.k_cache.shape[0], second.k_cache.shape[0])
    width = max(first.meta.block_tables.shape[1], second.meta.block_tables.shape[1])
    static = _static_copy(first, num_blocks, width)
    static.meta = _graph_meta(static.meta, 8192)
    run(backend, static, static.k_cache, static.v_cache)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(backend, static, static.k_cache, static.v_cache)
    for step in (second, first):
        _load_into(static, _static_copy(step, num_blocks, width))
        graph.replay()
        torch.testing.assert_close(out, run(TorchAttentionBackend(), step), atol=2e-2,
                                   rtol=2e-2)


@pytest.mark.parametrize("preload,splits", [("1", 16), ("0", 16), ("0", 4)])
def test_decode_right_after_a_pdl_kv_write(monkeypatch, preload, splits):
    """Decodes replayed in a graph right after the rotary kernel (PDL where the device has
    it) writes their new keys and values. Of more splits than the one-launch kernel takes:
    the preloading split kernel reads the older context before its wait and the new token
    after it, and gives the reference's rows (a context shorter than a tile, one tile, a
    split of several tiles), its splits merged by a reduction (replayed twice); its switch
    off, the split kernel does. Of 4 splits: the one-launch kernel."""
    from parashift.kernels import rotary
    monkeypatch.setenv(triton_backend.PRELOAD_ENV, preload)
    monkeypatch.setattr(triton_backend, "choose_num_splits", lambda *args: splits)
    seq_lens = [1, 64, 65, 700, 5000]
    step = make_step([1] * len(seq_lens), seq_lens, 32, 8, pad_tokens=2, seed=11)
    expected = run(TorchAttentionBackend(), step)
    head_dim = step.q.shape[-1]
    identity = torch.cat((torch.ones(8192, head_dim // 2), torch.zeros(8192, head_dim // 2)),
                         1).cuda()  # cos 1, sin 0: the rotation leaves q and k as they are
    positions = (step.meta.seq_lens.long() - 1).clamp(min=0)
    positions = torch.cat((positions, positions.new_zeros(2)))
    meta = _graph_meta(step.meta, 8192)
    backend = TritonAttentionBackend()
    k_cache, v_cache = step.k_cache.clone(), step.v_cache.clone()

    def decode():
        q = rotary.rotate_and_write_kv(positions, step.q, step.k, step.v, identity, k_cache,
                                       v_cache, meta.slot_mapping)
        return backend.attend(q, k_cache, v_cache, meta, head_dim ** -0.5)

    decode()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode()
    for _ in range(2):
        k_cache.copy_(step.k_cache)  # the new slots NaN again: only the rotary kernel fills them
        v_cache.copy_(step.v_cache)
        out.fill_(float("nan"))
        graph.replay()
        torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,block_size,splits",
                         [(32, 8, 128, 16, 1), (32, 8, 128, 16, 4), (12, 4, 64, 32, 2),
                          (16, 2, 256, 16, 1), (8, 8, 32, 16, 8)])
def test_fp8_pairs_decode(monkeypatch, num_heads, num_kv_heads, head_dim, block_size, splits,
                          f16="0"):
    """The one-launch kernel over an FP8 pool, its values read as 16-bit pairs
    (PARASHIFT_ATTN_FP8_PAIRS), against the reference on the pool upcast: odd lengths, GQA
    ratios, head sizes, block sizes, split counts, in a graph replayed
    twice (the padding rows zeros, the tickets reset)."""
    monkeypatch.setenv(triton_backend.FP8_PAIRS_ENV, "1")
    monkeypatch.setenv(triton_backend.FP8_F16_ENV, f16)
    monkeypatch.setattr(triton_backend, "choose_num_splits", lambda *args: splits)
    monkeypatch.setattr(triton_backend, "FUSED_UNSPLIT_PROGRAMS_PER_SM", 1 << 30)
    seq_lens = [1, 63, 64, 65, 777, 1040, 3001] + random_lengths(25, 1, 2100, seed=splits)
    step = make_step([1] * len(seq_lens), seq_lens, num_heads, num_kv_heads, head_dim,
                     block_size, pad_tokens=3, seed=9)
    k_cache, v_cache = step.k_cache.clone(), step.v_cache.clone()
    TritonAttentionBackend().write_kv(step.k, step.v, k_cache, v_cache, step.meta)
    k_cache, v_cache = k_cache.to(torch.float8_e4m3fn), v_cache.to(torch.float8_e4m3fn)
    scale = head_dim ** -0.5
    expected = TorchAttentionBackend().attend(step.q, k_cache.to(step.q.dtype),
                                              v_cache.to(step.q.dtype), step.meta, scale)
    meta = _graph_meta(step.meta, 4096)
    (seqs,) = triton_backend._split_decodes(meta, len(step.q))
    assert triton_backend._plan_launch(step.q, k_cache, meta, seqs).fused
    assert triton_backend.fp8_pairs(v_cache, head_dim)
    backend = TritonAttentionBackend()
    backend.attend(step.q, k_cache, v_cache, meta, scale)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.attend(step.q, k_cache, v_cache, meta, scale)
    for _ in range(2):
        out.fill_(float("nan"))
        graph.replay()
        torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("splits", [1, 4])
def test_fp8_pairs_f16_decode(monkeypatch, splits):
    """PARASHIFT_ATTN_FP8_F16=1: the pairs' products in fp16 (8B heads), against the
    reference as test_fp8_pairs_decode."""
    test_fp8_pairs_decode(monkeypatch, 32, 8, 128, 16, splits, f16="1")


def test_fp8_pairs_one_row_preloaded(monkeypatch):
    """One sequence over an FP8 pool in a graph for 32k tokens (32 splits): the preloading
    split kernel reads the values as pairs (its first tile's before the PDL wait), its splits
    merged by the reduction, at contexts of one token, under a tile, a few
    tiles a split."""
    monkeypatch.setenv(triton_backend.FP8_PAIRS_ENV, "1")
    monkeypatch.setattr(triton_backend, "choose_num_splits", lambda *args: 32)
    for seq_len in (1, 40, 1100, 30000):
        step = make_step([1], [seq_len], 32, 8, pad_tokens=0, seed=seq_len)
        k_cache, v_cache = step.k_cache.clone(), step.v_cache.clone()
        TritonAttentionBackend().write_kv(step.k, step.v, k_cache, v_cache, step.meta)
        k_cache, v_cache = k_cache.to(torch.float8_e4m3fn), v_cache.to(torch.float8_e4m3fn)
        scale = step.q.shape[-1] ** -0.5
        expected = TorchAttentionBackend().attend(step.q, k_cache.to(step.q.dtype),
                                                  v_cache.to(step.q.dtype), step.meta, scale)
        meta = _graph_meta(step.meta, 32768)
        (seqs,) = triton_backend._split_decodes(meta, 1)
        assert triton_backend._plan_launch(step.q, k_cache, meta, seqs).preload
        actual = TritonAttentionBackend().attend(step.q, k_cache, v_cache, meta, scale)
        torch.testing.assert_close(actual, expected, atol=2e-2, rtol=2e-2)
