"""RoPE, the KV write and decode attention in the preloading split kernel
(`TritonAttentionBackend.rotate_and_attend`) against the torch path: q/k norms, RoPE, the
slots written, attention; in the one-launch kernel (PARASHIFT_ATTN_ROPE_ONE_LAUNCH=1) against
the rotary kernel and that kernel after it (the pair): under the Triton interpreter on the CPU
(float32, float16) bit for bit; compiled on CUDA the V pool bit for bit, the output and the K
pool within the dtype's tolerance (their bits differed on an H200 in session 49 at 8B heads and
in fp16/fp32: benchmarks/rope_fold_diag.py reports where)."""
import os

import pytest
import torch

from parashift.attention import triton_backend
from parashift.attention.metadata import AttentionMetadata
from parashift.attention.rotate_attend import rotate_write_attend
from parashift.attention.torch_ref import TorchAttentionBackend, write_kv_slots
from parashift.layers.layernorm import rms_norm_torch
from parashift.layers.rotary import apply_rotary_torch
from tests.attention.test_triton_backend import make_step
from tests.kernels.common import case_tests, cuda
from tests.kernels.test_rotary import rotary_embedding

# 16 splits (more than the one-launch kernel takes); seq_lens: a context of one token, shorter
# than a tile, one tile and one more, several tiles a split, and (550 at the one-launch
# kernel's 4 splits: 3 tiles a split) the new token in a split before the last
CASES = [
    dict(seq_lens=[1, 40, 65, 1100, 550], num_heads=4, num_kv_heads=2, head_dim=32, pad=2),
    dict(seq_lens=[300, 7], num_heads=8, num_kv_heads=2, head_dim=64, norms=True),
]
DEVICE = os.environ.get("PARASHIFT_TEST_DEVICE", "cpu")
TOLERANCE = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 2e-2}


def check(seq_lens, num_heads, num_kv_heads, head_dim, dtype, device="cpu", pad=0,
          norms=False):
    torch_dtype = getattr(torch, dtype)
    step = make_step([1] * len(seq_lens), seq_lens, num_heads, num_kv_heads, head_dim,
                     dtype=torch_dtype, pad_tokens=pad, device=device)
    positions = torch.tensor([s - 1 for s in seq_lens] + [0] * pad, device=device)
    cos_sin = rotary_embedding(head_dim, device).cos_sin
    gen = torch.Generator().manual_seed(5)
    weights = (None if not norms else
               tuple((1 + 0.2 * torch.randn(head_dim, generator=gen)).to(torch_dtype).to(device)
                     for _ in range(2)))
    q, k = step.q, step.k
    if norms:
        q, k = rms_norm_torch(q, weights[0], 1e-6), rms_norm_torch(k, weights[1], 1e-6)
    q, k = apply_rotary_torch(positions, q, k, cos_sin)
    k_expected, v_expected = step.k_cache.clone(), step.v_cache.clone()
    write_kv_slots(k, step.v, k_expected, v_expected, step.meta.slot_mapping)
    scale = head_dim ** -0.5
    expected = TorchAttentionBackend().attend(q, k_expected, v_expected, step.meta, scale)

    meta = AttentionMetadata(**{**step.meta.__dict__, "static_shape": True,
                                "query_start_loc_cpu": list(range(len(seq_lens) + 1)),
                                "seq_lens_cpu": [8192] * len(seq_lens), "max_seq_len": 8192})
    backend = triton_backend.TritonAttentionBackend()
    chooser = triton_backend.choose_num_splits
    tol = TOLERANCE[dtype]
    results = {}
    try:  # 16 splits: RoPE in the preloading kernel; 4 (the one-launch kernel's): before it,
        # and in it (one_launch)
        for splits, one_launch in ((16, "0"), (4, "0"), (4, "1")):
            triton_backend.choose_num_splits = lambda *args: splits
            os.environ[triton_backend.ROPE_ONE_LAUNCH_ENV] = one_launch
            k_cache, v_cache = step.k_cache.clone(), step.v_cache.clone()
            launch = backend.rope_launch(step.q, k_cache, meta)[1]
            assert launch.preload == (splits == 16) and launch.fused == (splits == 4)
            assert triton_backend._takes_rope(launch, head_dim) == (splits == 16
                                                                   or one_launch == "1")
            actual = rotate_write_attend(backend, positions, step.q, step.k, step.v, cos_sin,
                                         k_cache, v_cache, meta, scale,
                                         None if not norms else (*weights, 1e-6))
            torch.testing.assert_close(actual, expected, atol=tol, rtol=tol)
            torch.testing.assert_close(k_cache, k_expected, atol=tol, rtol=tol, equal_nan=True)
            torch.testing.assert_close(v_cache, v_expected, atol=0, rtol=0, equal_nan=True)
            results[one_launch] = actual, k_cache.nan_to_num(), v_cache.nan_to_num()
    finally:
        triton_backend.choose_num_splits = chooser
        del os.environ[triton_backend.ROPE_ONE_LAUNCH_ENV]
    assert_fold_matches_pair(results["1"], results["0"], tol, exact=device == "cpu")


def assert_fold_matches_pair(fold, pair, tol: float, exact: bool) -> None:
    """The fold's (output, K pool, V pool) against the pair's: every tensor bit for bit where
    `exact` (the interpreter), else (CUDA) the V pool bit for bit (a copy) and the output and K
    pool within tol."""
    if exact:
        for folded, paired in zip(fold, pair):
            assert torch.equal(folded, paired)
        return
    torch.testing.assert_close(fold[0], pair[0], atol=tol, rtol=tol)
    torch.testing.assert_close(fold[1], pair[1], atol=tol, rtol=tol)
    assert torch.equal(fold[2], pair[2])

test_interpreted, test_cuda = case_tests(__name__, check, CASES, uses_dot=True)


@cuda
def test_new_token_first_gives_the_same_bits(monkeypatch):
    """The split holding the new token reading its key and value beside q (the default) or
    after its tiles (PARASHIFT_ATTN_NEW_FIRST=0): the same output and pool, bit for bit, at 16
    splits of one and of several tiles (8B heads, bf16)."""
    from parashift.attention import triton_decode_preload
    seq_lens = [1, 65, 1100, 2000]
    step = make_step([1] * 4, seq_lens, 32, 8, 128, dtype=torch.bfloat16, device="cuda")
    positions = torch.tensor([s - 1 for s in seq_lens], device="cuda")
    cos_sin = rotary_embedding(128, "cuda").cos_sin
    meta = AttentionMetadata(**{**step.meta.__dict__, "static_shape": True,
                                "query_start_loc_cpu": list(range(5)),
                                "seq_lens_cpu": [2048] * 4, "max_seq_len": 2048})
    backend = triton_backend.TritonAttentionBackend()
    monkeypatch.setattr(triton_backend, "choose_num_splits", lambda *args: 16)
    results = []
    for flag in ("1", "0"):
        monkeypatch.setenv(triton_decode_preload.NEW_FIRST_ENV, flag)
        k_cache, v_cache = step.k_cache.clone(), step.v_cache.clone()
        out = rotate_write_attend(backend, positions, step.q, step.k, step.v, cos_sin,
                                  k_cache, v_cache, meta, 128 ** -0.5, None)
        results.append((out, k_cache.nan_to_num(), v_cache.nan_to_num()))
    assert backend.rope_launch(step.q, step.k_cache, meta)[1].preload
    for first, later in zip(*results):
        assert torch.equal(first, later)


@cuda
@pytest.mark.parametrize("norms", [False, True], ids=["no_norms", "qk_norms"])
@pytest.mark.parametrize("rows,splits", [(64, None), (8, 4), (3, 2)])
def test_one_launch_rope_matches_the_pair_at_8b_heads(monkeypatch, rows, splits, norms):
    """The one-launch kernel with RoPE (PARASHIFT_ATTN_ROPE_ONE_LAUNCH=1) against the rotary
    kernel then that kernel (8B heads, bf16; contexts of 1 to ~2,000 tokens, graphs' static
    shapes for 2,048, two rows of padding; 64 rows unsplit as the plan takes them, 8 and 3
    rows split by tickets): the same V pool, the output and K pool within bf16's tolerance (not
    the same bits on an H200 at 64 and 8 rows: benchmarks/rope_fold_diag.py)."""
    gen = torch.Generator().manual_seed(rows)
    seq_lens = [1, 64, 65, *torch.randint(2, 2000, (rows - 3,), generator=gen).tolist()]
    step = make_step([1] * rows, seq_lens[:rows], 32, 8, 128, dtype=torch.bfloat16, pad_tokens=2,
                     device="cuda")
    positions = torch.tensor([s - 1 for s in seq_lens[:rows]] + [0, 0], device="cuda")
    cos_sin = rotary_embedding(128, "cuda").cos_sin
    weights = (None if not norms else
               tuple((1 + 0.2 * torch.randn(128, generator=gen)).to(torch.bfloat16).cuda()
                     for _ in range(2)))
    meta = AttentionMetadata(**{**step.meta.__dict__, "static_shape": True,
                                "query_start_loc_cpu": list(range(rows + 1)),
                                "seq_lens_cpu": [2048] * rows, "max_seq_len": 2048})
    backend = triton_backend.TritonAttentionBackend()
    if splits is not None:
        monkeypatch.setattr(triton_backend, "choose_num_splits", lambda *args: splits)
    results = {}
    for flag in ("0", "1"):
        monkeypatch.setenv(triton_backend.ROPE_ONE_LAUNCH_ENV, flag)
        launch = backend.rope_launch(step.q, step.k_cache, meta)[1]
        assert launch.fused and launch.num_splits == (splits or 1)
        assert triton_backend._takes_rope(launch, 128) == (flag == "1")
        k_cache, v_cache = step.k_cache.clone(), step.v_cache.clone()
        out = rotate_write_attend(backend, positions, step.q, step.k, step.v, cos_sin,
                                  k_cache, v_cache, meta, 128 ** -0.5,
                                  None if not norms else (*weights, 1e-6))
        results[flag] = out, k_cache.nan_to_num(), v_cache.nan_to_num()
    assert_fold_matches_pair(results["1"], results["0"], TOLERANCE["bfloat16"], exact=False)


@pytest.mark.skipif(DEVICE != "cuda", reason="needs PARASHIFT_TEST_DEVICE=cuda")
@pytest.mark.parametrize("family", ["llama-gqa-untied", "qwen3-qk-norm-head-dim"])
def test_an_engine_gives_the_same_tokens_with_rope_in_the_one_launch_kernel(
        monkeypatch, tmp_path, family):
    """bf16 decode of 20 sequences in CUDA graphs (a tiny Llama; a tiny Qwen3, its q/k norms
    in the kernel) with PARASHIFT_ATTN_ROPE_ONE_LAUNCH=1 against 0: the same greedy tokens,
    the fold taken by some launch."""
    from parashift import LLM
    from tests.deterministic.test_batch_invariance import GREEDY
    from tests.helpers.tiny_configs import save_tiny_checkpoint
    save_tiny_checkpoint(family, tmp_path)
    taken = []
    takes_rope = triton_backend._takes_rope
    monkeypatch.setattr(triton_backend, "_takes_rope",
                        lambda launch, head_dim: taken.append(launch.fused and takes_rope(
                            launch, head_dim)) or taken[-1])
    prompts = [[(7 * i + 3 * j) % 500 + 1 for j in range(5 + i)] for i in range(20)]
    tokens = {}
    for flag in ("0", "1"):
        monkeypatch.setenv(triton_backend.ROPE_ONE_LAUNCH_ENV, flag)
        with LLM(model=str(tmp_path), device="cuda", dtype="bfloat16", skip_tokenizer_init=True,
                 num_blocks=256, max_num_seqs=20, max_model_len=128, cuda_graphs=True) as llm:
            tokens[flag] = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
        assert any(taken) == (flag == "1")
        taken.clear()
    assert tokens["1"] == tokens["0"]


def test_a_prompt_step_takes_the_backends_own_attend(monkeypatch):
    """A step that prefills goes through `attend`, so a subclass's routes hold there (the
    cuDNN backend's long prompts: Qwen3's fused q/k norms went to the Triton kernel past
    them, 20.9 against 12.4 ms of a 4,096-token prefill's attention on an H200)."""
    calls = []

    class Routed(triton_backend.TritonAttentionBackend):
        def attend(self, q, k_cache, v_cache, meta, scale):
            calls.append(meta)
            return q

    monkeypatch.setattr(triton_backend.rotary, "rotate_and_write_kv", lambda pos, q, *a: q)
    step = make_step([5, 3], [5, 3], 4, 2, 32, dtype=torch.float32, device="cpu")
    positions = torch.arange(8)
    out = rotate_write_attend(Routed(), positions, step.q, step.k, step.v, None, step.k_cache,
                              step.v_cache, step.meta, 0.1)
    assert out is step.q and calls == [step.meta]
