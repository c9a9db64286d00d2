"""The batch-invariant kernels, bit for bit: a GEMM row does not change with the rows or
output columns computed beside it, the canonical K-chunk sum gives the same bits fused
(one device) and gathered (a TP group), and an attention row does not change with its
sequence's chunking (prefill, chunked prefill, decode), the other sequences of the step,
or the heads a rank holds. The Triton kernels run under the interpreter on the CPU (the
compiled ones on CUDA), the torch paths directly."""
from unittest import mock

import pytest
import torch

from parashift.attention.metadata import AttentionMetadata
from parashift.deterministic import k_chunks, matmul
from parashift.deterministic.reduction import check_plans, reduction_chunks
from parashift.parallel.plan import Plan
from tests.kernels.common import assert_exact, case_tests, cuda, randn

MATMUL_CASES = [dict(m=5, n=96, k=192, chunks=4, bias=True),
                dict(m=70, n=130, k=96, chunks=1, bias=False),
                dict(m=1, n=64, k=384, chunks=6, bias=False),
                dict(m=3, n=80, k=512, chunks=4, bias=True),  # two K tiles per chunk
                # many rows' tiles; a TP half's short run in program in FILL_TILES
                dict(m=300, n=192, k=1024, chunks=8, bias=False)]


def check_matmul(m, n, k, chunks, bias, dtype, device="cpu", triton=True):
    x, w = randn((m + 20, k), dtype, device, seed=1), randn((n, k), dtype, device, seed=2)
    b = randn((n,), dtype, device, seed=3) if bias else None
    if triton:
        from parashift.deterministic.triton_matmul import fold_chunks, linear, sum_chunks
        full = linear(x, w, b, chunks, spread=False)  # the chunks summed in one program
        # the chunks spread over programs and added by the sum kernel (decode batches)
        assert_exact(linear(x, w, b, chunks, spread=True), full)
    else:
        fold_chunks, sum_chunks = matmul.fold_chunks, matmul.sum_chunks

        def linear(x, w, b, c, groups=1):
            return matmul.reduce_chunks(x, w, b, c, groups)
        full = linear(x, w, b, chunks)
    ref = x.double() @ w.double().T + (b.double() if bias else 0)
    tol = 1e-4 if dtype == "float32" else 3e-2
    torch.testing.assert_close(full.double(), ref, rtol=tol, atol=tol * k ** 0.5)
    for rows in (1, 2, m):  # fewer rows
        assert_exact(linear(x[:rows], w, b, chunks), full[:rows])
    half = n // 2  # a TP shard's output columns
    assert_exact(linear(x, w[:half], b[:half] if bias else None, chunks), full[:, :half])
    parts = fold_chunks(x, w, chunks, chunks)
    assert_exact(sum_chunks(parts, b, x.dtype), full)
    if chunks % 2 == 0:  # a row-parallel projection's order: two halves, then their sum
        grouped = linear(x, w, b, chunks, groups=2)
        assert_exact(matmul.finish(matmul.ordered_sum(parts.cpu(), groups=2), b.cpu()
                                   if bias else None, x.dtype), grouped.cpu())
        assert_exact(sum_chunks(parts, b, x.dtype, groups=2), grouped)
        for rows in (1, 2):
            assert_exact(linear(x[:rows], w, b, chunks, groups=2), grouped[:rows])
        if triton:
            assert_exact(linear(x, w, b, chunks, spread=True, groups=2), grouped)
        # two TP ranks: each sums its half in its GEMM programs, one all-gather, one add
        cut = k // 2
        halves = torch.cat([fold_chunks(x[:, :cut], w[:, :cut], chunks // 2, 1),
                            fold_chunks(x[:, cut:], w[:, cut:], chunks // 2, 1)])
        assert_exact(sum_chunks(halves, b, x.dtype), grouped)
        # a pair exchange's store (parallel/pair_exchange.py): the term here and in the mirror
        out, mirror = torch.empty_like(halves[:1]), torch.empty_like(halves[:1])
        fold_chunks(x[:, :cut], w[:, :cut], chunks // 2, 1, out, mirror)
        assert_exact(out, halves[:1])
        assert_exact(mirror, halves[:1])


test_matmul_interpreted, test_matmul_cuda = case_tests(__name__, check_matmul, MATMUL_CASES,
                                                       uses_dot=True, variants_in_one_dtype=True)


@cuda
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("rows,n,k", [("MID_ROWS", 320, 1024), ("LARGE_ROWS", 320, 1024),
                                      ("DECODE_TMA_ROWS", "WIDE_N", 1024),
                                      ("DECODE_TMA_ROWS", 320, "LONG_K"),
                                      ("DECODE_TMA_ROWS", "MID_N", 1024),
                                      ("DECODE_TMA_ROWS", 320, 1024)])
def test_matmul_of_many_rows_cuda(dtype, rows, n, k):
    """From MID_ROWS and from LARGE_ROWS rows on the GEMM takes other tiles, loaded by TMA on
    Hopper, as do the widest, the longest and the narrowest products from DECODE_TMA_ROWS,
    and products of MID_N columns take MID_N_TILES: their rows keep the few-rows tile's
    bits."""
    from parashift.deterministic import triton_matmul
    size = {name: getattr(triton_matmul, name) for name in ("WIDE_N", "LONG_K", "MID_N")}
    check_matmul(m=getattr(triton_matmul, rows) + 76, n=size.get(n, n), k=size.get(k, k),
                 chunks=8, bias=True, dtype=dtype, device="cuda")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", MATMUL_CASES, ids=lambda c: f"m{c['m']}-n{c['n']}-c{c['chunks']}")
def test_matmul_torch(case, dtype):
    check_matmul(**case, dtype=dtype, device="cpu", triton=False)


def attend(backend, seqs, q_lens, heads, kv_heads, block_size=16):
    """Each of `seqs` (q, k, v of its whole context) with its last q_lens[i] tokens new
    in one step over a paged pool (blocks of each sequence in reverse order); returns the
    output rows of each sequence, heads [0, heads) against KV heads [0, kv_heads)."""
    device, dtype, d = seqs[0][0].device, seqs[0][0].dtype, seqs[0][0].shape[2]
    blocks = [-(-len(q) // block_size) for q, _, _ in seqs]
    pool = (sum(blocks) + 1, block_size, kv_heads, d)
    k_cache = torch.zeros(pool, dtype=dtype, device=device)
    v_cache = torch.zeros_like(k_cache)
    tables = torch.zeros(len(seqs), max(blocks), dtype=torch.int32, device=device)
    slots, qs, used = [], [], 1
    for i, ((q, k, v), q_len) in enumerate(zip(seqs, q_lens)):
        table = torch.arange(used + blocks[i] - 1, used - 1, -1, device=device)
        used += blocks[i]
        tables[i, :blocks[i]] = table.int()
        pos = torch.arange(len(q), device=device)
        seq_slots = table[pos // block_size] * block_size + pos % block_size
        cached = len(q) - q_len
        # the new tokens' too, as write_kv would (its kernel is tests/kernels/test_rotary's)
        k_cache.view(-1, kv_heads, d)[seq_slots] = k[:, :kv_heads]
        v_cache.view(-1, kv_heads, d)[seq_slots] = v[:, :kv_heads]
        slots.append(seq_slots[cached:])
        qs.append(q[cached:, :heads])
    starts = [0]
    for q_len in q_lens:
        starts.append(starts[-1] + q_len)
    seq_lens = [len(q) for q, _, _ in seqs]
    meta = AttentionMetadata(
        slot_mapping=torch.cat(slots).long(),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=tables, query_start_loc_cpu=starts, seq_lens_cpu=seq_lens,
        max_query_len=max(q_lens), max_seq_len=max(seq_lens), block_size=block_size)
    out = backend.attend(torch.cat(qs).contiguous(), k_cache, v_cache, meta, d ** -0.5)
    return list(out.split(q_lens))


def check_attention(dtype, device="cpu", backend="triton", heads=8, kv_heads=2, head_dim=32,
                    block_m=None, partition=None, length=150, decode="small", tile_n=None):
    if tile_n is not None:  # PARASHIFT_DETERMINISTIC_ATTENTION_TILE_N, read at import
        from parashift.attention import triton_backend
        saved, triton_backend.INVARIANT_TILE_N = triton_backend.INVARIANT_TILE_N, tile_n
        try:
            return check_attention(dtype, device, backend, heads, kv_heads, head_dim, block_m,
                                   partition, length, decode)
        finally:
            triton_backend.INVARIANT_TILE_N = saved
    forced = None
    if backend == "triton":
        from parashift.attention.triton_backend import TritonAttentionBackend
        rows = {"invariant_block_m": block_m} if block_m else {}  # else the default's
        if partition:
            rows["invariant_partition"] = partition
        rows["invariant_decode"] = decode  # small: decodes in programs of 16 rows, not 128
        impl = TritonAttentionBackend(batch_invariant=True, **rows)

        class ForcedSplits(TritonAttentionBackend):
            """Decode launches with their partitions over `splits` programs each."""
            def __init__(self, splits):
                super().__init__(batch_invariant=True, **rows)
                self.splits = splits

            def _plan(self, q, k_cache, meta, seqs, num_splits=None):
                return super()._plan(q, k_cache, meta, seqs, self.splits if seqs.decode else None)
        forced = ForcedSplits
    else:
        from parashift.attention.torch_invariant import InvariantTorchAttentionBackend
        impl = InvariantTorchAttentionBackend()
    dtype = getattr(torch, dtype)

    def sequence(length, seed):
        return tuple(randn((length, h, head_dim), str(dtype).split(".")[1], device, seed=seed + j)
                     for j, h in enumerate((heads, kv_heads, kv_heads)))
    target, short, long = sequence(length, 0), sequence(9, 10), sequence(200, 20)
    prefill, = attend(impl, [target], [length], heads, kv_heads)
    # chunked prefill (the last 50 positions) among a decode and another prefill chunk
    _, chunk, _ = attend(impl, [short, target, long], [1, 50, 120], heads, kv_heads)
    assert_exact(chunk, prefill[length - 50:])
    # chunks starting off the query blocks' and the KV tiles' boundaries, so that a row
    # sits in another query block (with other whole tiles before it) than in one shot
    for start, end in ((0, 37), (37, 97), (97, 131), (131, length)):
        part, = attend(impl, [tuple(t[:end] for t in target)], [end - start], heads, kv_heads)
        assert_exact(part, prefill[start:end])
    # decodes of every sequence
    decode, _, _ = attend(impl, [target, short, long], [1, 1, 1], heads, kv_heads)
    assert_exact(decode, prefill[-1:])
    # split-KV decodes: the row's fixed partitions over 1-4 programs, merged by the reduction
    for splits in (1, 2, 3, 4) if forced else ():
        decode, _, _ = attend(forced(splits), [target, short, long], [1, 1, 1], heads, kv_heads)
        assert_exact(decode, prefill[-1:])
    if forced:
        from parashift.attention import triton_backend
        # one program per row with its partitions merged by the reduction all the same; and
        # partials too large to store, so that each program merges its partitions itself
        for name, value, launcher in (("INVARIANT_UNSPLIT_MERGE", "reduction", forced(1)),
                                      ("MAX_INVARIANT_PARTIAL_BYTES", 0, impl)):
            with mock.patch.object(triton_backend, name, value):
                decode, _, _ = attend(launcher, [target, short, long], [1, 1, 1], heads,
                                      kv_heads)
            assert_exact(decode, prefill[-1:])
    # a rank holding half the heads (SP=2 or TP=2): the same rows for its heads
    half, = attend(impl, [target], [length], heads // 2, kv_heads // 2)
    assert_exact(half, prefill[:, :heads // 2])


# the default query rows per program (the prefill configuration's 128, decodes' 16), decodes
# in the prefill configuration, and the selectable PARASHIFT_DETERMINISTIC_ATTENTION_BLOCK_M
# variants; partitions of 128 (the default) and 256 tokens: one and two KV tiles each, several
# per row; KV tiles of 64 and 32 tokens (PARASHIFT_DETERMINISTIC_ATTENTION_TILE_N). The
# default case packs GQA groups of 4 query heads; the variants groups of 2 (half the
# programs: under the interpreter a program's cost is nearly fixed).
test_attention_interpreted, test_attention_cuda = case_tests(
    __name__, check_attention,
    [{}] + [{**variant, "heads": 4} for variant in (
        {"decode": "prefill"}, {"block_m": 64}, {"block_m": 16},
        {"partition": 256, "length": 300, "block_m": 16}, {"tile_n": 64},
        {"tile_n": 32, "partition": 128})],
    uses_dot=True, variants_in_one_dtype=True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("invariant", [True, False])
def test_attention_compiles_one_tile_loop_when_invariant(invariant, dtype):
    """What the interpreter cannot show: the compiled kernel (sm_90, built on the CPU) walks
    every KV tile with one loop's code in batch-invariant mode. With two loops (the default)
    a tile's instructions depend on the query block holding the row, and chunked prefill
    changed bits on an H200."""
    ttir = compile_prefill_attention(getattr(torch, dtype), invariant)
    # a tile loop holds two dots (scores, weighted values); invariant: one tile loop, nested
    # in the loop over the context's fixed partitions, with a third dot (the row sums)
    assert ttir.count("tt.dot") == (3 if invariant else 4)
    assert ttir.count("scf.for") == 2


def compile_prefill_attention(dtype, invariant, heads=32, kv_heads=8, head_dim=128):
    """The TTIR of the prefill launch over the 8B shape's heads, compiled for sm_90."""
    from parashift.attention import triton_backend as backend
    from parashift.attention.triton_kernels import paged_attention_kernel
    q = torch.empty(64, heads, head_dim, dtype=dtype)
    k_cache = torch.empty(4, 16, kv_heads, head_dim, dtype=dtype)
    meta = AttentionMetadata(None, None, None, None, [0, 64], [64], 64, 64, 16)
    seqs = backend._SeqRange(0, 1, 0, 64, False)
    launch = (backend._plan_invariant_launch(q, k_cache, meta, seqs, 1, None,
                                             backend.INVARIANT_PARTITION) if invariant
              else backend._plan_launch(q, k_cache, meta, seqs, num_splits=1))
    constants = dict(GROUP=launch.group, GROUP_P=launch.group_p, BLOCK_Q=launch.block_q,
                     BLOCK_M=launch.config.block_m, TILE_N=launch.config.tile_n, BLOCK_SIZE=16,
                     HEAD_DIM=head_dim, HEAD_DIM_P=head_dim, SPLIT=False,
                     DOT_PRECISION=backend._dot_precision(dtype, invariant),
                     MASK_EVERY_TILE=invariant, PARTITION_TILES=launch.partition_tiles,
                     CONTEXT_SPLITS=launch.context_splits, USE_PDL=False)
    element = {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]
    pointers = dict.fromkeys(("out_ptr", "q_ptr", "k_cache_ptr", "v_cache_ptr"), element)
    pointers.update(dict.fromkeys(("block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr"),
                                  "i32"))
    return compile_sm90(paged_attention_kernel, constants, pointers, ("qk_scale",),
                        num_warps=launch.config.num_warps,
                        num_stages=launch.config.num_stages)["ttir"]


def compile_sm90(kernel, constants: dict, pointers: dict, floats=(), types=None,
                 **options) -> dict:
    """The kernel's IRs and PTX for an H100/H200, compiled on the CPU: pointers are fp32
    unless `pointers` names their element, scalars i32 unless in `floats`, other arguments
    (e.g. "tensordesc<fp8e4nv[64, 128]>") as `types` names them."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    signature = {}
    for name in inspect.signature(kernel.fn).parameters:
        if name in constants:
            signature[name] = "constexpr"
        elif name in (types or {}):
            signature[name] = types[name]
        elif name.endswith("_ptr"):
            signature[name] = "*" + pointers.get(name, "fp32")
        else:
            signature[name] = "fp32" if name in floats else "i32"
    source = ASTSource(kernel, signature, constexprs=constants)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm


@pytest.mark.parametrize("rows", [1, 256])
@pytest.mark.parametrize("whole_tiles", [False, True])
def test_spread_chunks_compile_to_the_same_mma_chain(whole_tiles, rows):
    """The spread GEMM's bits (fp32 blocks) equal the in-program one's only if each chunk's
    K loop issues the same tensor-core instructions in the same order: checked on sm_90's
    PTX (bf16), for the tiles of few rows and of many."""
    import re

    from parashift.deterministic import triton_matmul as tm
    block_m, block_n, block_k, warps, stages = tm.tiles_for(rows)

    def mma_lines(out_dtype: str) -> list[str]:
        constants = dict(WHOLE_TILES=whole_tiles, TILES_PER_CHUNK=8 if whole_tiles else 0,
                         GROUPS=1, HAS_BIAS=False, BLOCK_M=block_m,
                         BLOCK_N=block_n, BLOCK_K=block_k, DOT_PRECISION="tf32")
        pointers = {"out_ptr": out_dtype, "x_ptr": "bf16", "w_ptr": "bf16"}
        ptx = compile_sm90(tm.invariant_matmul_kernel, constants, pointers,
                           num_warps=warps, num_stages=stages,
                           enable_fp_fusion=False)["ptx"]
        return [re.sub(r"%[a-z]+\d+", "%r", line.strip()) for line in ptx.splitlines()
                if "mma" in line]
    lines = mma_lines("bf16")  # one block: the sum rounded to x's dtype
    assert any("mma_async" in line or "mma.sync" in line for line in lines)
    assert mma_lines("fp32") == lines  # blocks (partials, groups) stored in fp32


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_attention_torch(dtype):
    check_attention(dtype, "cpu", backend="torch")


def test_default_attention_is_not_invariant():
    """The check above can fail: torch's SDPA path changes bits with the chunking."""
    from parashift.attention.torch_ref import TorchAttentionBackend
    q, k, v = (randn((150, h, 32), "float32", "cpu", seed=j) for j, h in enumerate((8, 2, 2)))
    prefill, = attend(TorchAttentionBackend(), [(q, k, v)], [150], 8, 2)
    chunks = [attend(TorchAttentionBackend(), [(q[:n], k[:n], v[:n])], [1], 8, 2)[0]
              for n in range(100, 150)]
    assert not torch.equal(torch.cat(chunks), prefill[100:])


def test_gemm_tile_configuration_is_checked():
    from parashift.deterministic.triton_matmul import tile_config
    assert tile_config("64,128,64,8,4") == (64, 128, 64, 8, 4)
    for bad in ("64,64,64,4", "64,48,64,4,3", "64,64,8,4,3", "64,64,64,4,0", "a,b,c,d,e"):
        with pytest.raises(ValueError, match="expected m,n,k,warps,stages"):
            tile_config(bad)


def test_column_chunks_are_whole_tiles():
    # chunks from SPREAD_MIN_K only (below, nothing spreads them); each of whole 64-wide tiles
    assert [k_chunks.column_chunks(k) for k in (8192, 14336, 8192 + 192, 9 * 1024, 4096, 576)] \
        == [8, 8, 1, 8, 1, 1]


def test_chunks_serve_every_allowed_tp_degree():
    from types import SimpleNamespace as Config
    llama_8b = Config(num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336)
    smollm2 = Config(num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536)
    six_heads = Config(num_attention_heads=6, num_key_value_heads=3, intermediate_size=192)
    assert [reduction_chunks(c) for c in (llama_8b, smollm2, six_heads)] == [8, 3, 6]
    check_plans(six_heads, [Plan(tp=3), Plan(sp=2), Plan(tp=2, dp=2)])
    with pytest.raises(ValueError, match="tp = 4, which does not divide the 6 K chunks"):
        check_plans(six_heads, [Plan(tp=4)])


def test_invariant_decode_attention_mode_is_checked():
    from parashift.attention.triton_backend import TritonAttentionBackend
    with pytest.raises(ValueError, match="decode attention is one of"):
        TritonAttentionBackend(batch_invariant=True, invariant_decode="tiny")


def test_invariant_decode_launch_takes_few_rows_over_the_same_tiles():
    from parashift.attention import triton_backend as backend
    q = torch.empty(3, 32, 128, dtype=torch.bfloat16)
    k_cache = torch.empty(4, 16, 8, 128, dtype=torch.bfloat16)
    meta = AttentionMetadata(None, None, None, None, [0, 1, 2, 3], [9, 9, 9], 1, 9, 16)
    seqs = backend._SeqRange(0, 3, 0, 3, True)
    small, prefill = (backend._plan_invariant_launch(q, k_cache, meta, seqs, 1, None, 1024,
                                                     small_decode=small) for small in (True, False))
    assert (small.config.block_m, small.config.num_warps) == (16, 4)
    assert (prefill.config.block_m, prefill.config.num_warps) == (128, 8)
    assert small.config.tile_n == prefill.config.tile_n == 128
    assert small.partition_tiles == prefill.partition_tiles == 8


def test_an_unsplit_decode_launch_merges_its_partitions_in_program(monkeypatch):
    """Partial states are stored for a reduction only where a row's partitions are spread
    over programs, or with PARASHIFT_DETERMINISTIC_UNSPLIT_MERGE=reduction."""
    from parashift.attention import triton_backend as backend
    q = torch.empty(256, 32, 128, dtype=torch.bfloat16)
    k_cache = torch.empty(4, 16, 8, 128, dtype=torch.bfloat16)
    meta = AttentionMetadata(None, None, None, None, list(range(257)), [4000] * 256, 1, 4000, 16)
    decodes = backend._SeqRange(0, 256, 0, 256, True)

    def stores(splits=None, seqs=decodes):
        launch = backend._plan_invariant_launch(q, k_cache, meta, seqs, splits, None, 1024,
                                                small_decode=True)
        return launch.num_splits, launch.partials

    assert stores() == (1, False)  # 256 rows fill the device (132 SMs on the CPU) unsplit
    assert stores(2) == (2, True)
    assert stores(seqs=backend._SeqRange(0, 1, 0, 1, True)) == (4, True)  # one row: split
    monkeypatch.setattr(backend, "INVARIANT_UNSPLIT_MERGE", "reduction")
    assert stores() == (1, True)


def test_invariant_attention_rows_per_program_are_checked():
    from parashift.attention.triton_backend import TritonAttentionBackend
    with pytest.raises(ValueError, match="power of two of at least 16, not 48"):
        TritonAttentionBackend(batch_invariant=True, invariant_block_m=48)
