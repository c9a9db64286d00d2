"""RoPE, the KV write and decode attention in the preloading split kernel
(`TritonAttentionBackend.rotate_and_attend`) against the torch path: q/k norms, RoPE, the
slots written, attention; and for the one-launch kernel's steps, the rotary kernel before it,
likewise (under the Triton interpreter on the CPU, and on CUDA)."""
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
    try:  # 16 splits: RoPE in the preloading kernel; 4 (the one-launch kernel's): before it
        for splits in (16, 4):
            triton_backend.choose_num_splits = lambda *args: splits
            k_cache, v_cache = step.k_cache.clone(), step.v_cache.clone()
            launch = backend.rope_launch(step.q, k_cache, meta)[1]
            assert launch.preload == (splits == 16) and launch.fused == (splits == 4)
            actual = rotate_write_attend(backend, positions, step.q, step.k, step.v, cos_sin,
                                         k_cache, v_cache, meta, scale,
                                         None if not norms else (*weights, 1e-6))
            torch.testing.assert_close(actual, expected, atol=tol, rtol=tol)
            torch.testing.assert_close(k_cache, k_expected, atol=tol, rtol=tol, equal_nan=True)
            torch.testing.assert_close(v_cache, v_expected, atol=0, rtol=0, equal_nan=True)
    finally:
        triton_backend.choose_num_splits = chooser


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
