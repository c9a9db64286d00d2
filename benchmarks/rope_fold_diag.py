"""Where the one-launch decode kernel's RoPE fold (PARASHIFT_ATTN_ROPE_ONE_LAUNCH=1,
attention/triton_decode_rope.py) and the pair it replaces (kernels/rotary.py's kernel, then the
one-launch kernel) give different bits on CUDA (issues 60/61; session 49's H200 run: the
output differed at 8B heads, 64 rows unsplit and 8 rows at 4 splits).

The cases of tests/attention/test_rotate_attend.py's 8B-head test (bf16, 32/8 heads x 128,
two padding rows, graphs' static shapes for 2,048), each under several probes, each probe the
pair against the fold (unless named otherwise):
- `as_tested`: the test's inputs;
- `repeat_fold` / `repeat_pair`: each path twice on the same inputs (run-to-run determinism);
- `slot_prewritten`: the fold on a pool whose new slots already hold the pair's key and value
  (equal to the pair: the difference came from reading the slot back);
- `identity_rope`: every position 0 (cos 1, sin 0: the rotation exact in any arithmetic; equal:
  the difference is the rotation's or the norm's arithmetic, not the attention's);
- `one_stage` (the first case only): both with num_stages 1 (no cp.async pipelining of the
  KV tiles).
For each, which of out / k_cache / v_cache differ, how many elements, max |diff|, and where:
the rows (with their context, its tiles, the new token's place in its tile), the heads, and
for the pools whether every differing element is in a new token's slot.

Usage: python benchmarks/rope_fold_diag.py [--output diag.json] [--cases 64,8:4]"""
import argparse
import dataclasses
import json
import os

import torch

from parashift.attention import triton_backend
from parashift.attention.metadata import AttentionMetadata
from parashift.attention.rotate_attend import rotate_write_attend
from tests.attention.test_triton_backend import make_step
from tests.kernels.test_rotary import rotary_embedding

HEADS, KV_HEADS, HEAD_DIM, PAD, TILE_N = 32, 8, 128, 2, 64


def build(rows: int, norms: bool, device: str):
    """The 8B-head test's step for `rows` decodes (its seeds): (step, positions, cos_sin,
    norms tuple or None, metadata with static shapes, seq_lens)."""
    gen = torch.Generator().manual_seed(rows)
    seq_lens = [1, 64, 65, *torch.randint(2, 2000, (rows - 3,), generator=gen).tolist()][:rows]
    step = make_step([1] * rows, seq_lens, HEADS, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16,
                     pad_tokens=PAD, device=device)
    positions = torch.tensor([s - 1 for s in seq_lens] + [0] * PAD, device=device)
    weights = (None if not norms else
               (*((1 + 0.2 * torch.randn(HEAD_DIM, generator=gen)).to(torch.bfloat16).to(device)
                  for _ in range(2)), 1e-6))
    meta = AttentionMetadata(**{**step.meta.__dict__, "static_shape": True,
                                "query_start_loc_cpu": list(range(rows + 1)),
                                "seq_lens_cpu": [2048] * rows, "max_seq_len": 2048})
    return step, positions, rotary_embedding(HEAD_DIM, device).cos_sin, weights, meta, seq_lens


def run(folded: bool, step, positions, cos_sin, norms, meta, caches=None):
    """(out, k_cache, v_cache) of one path; caches: the pools to start from (else the step's)."""
    os.environ[triton_backend.ROPE_ONE_LAUNCH_ENV] = "1" if folded else "0"
    backend = triton_backend.TritonAttentionBackend()
    launch = backend.rope_launch(step.q, step.k_cache, meta)[1]
    assert launch.fused and triton_backend._takes_rope(launch, HEAD_DIM) == folded
    k_cache, v_cache = (c.clone() for c in (caches or (step.k_cache, step.v_cache)))
    out = rotate_write_attend(backend, positions, step.q, step.k, step.v, cos_sin, k_cache,
                              v_cache, meta, HEAD_DIM ** -0.5, norms)
    if out.is_cuda:
        torch.cuda.synchronize()
    return out, k_cache, v_cache


def out_where(a: torch.Tensor, b: torch.Tensor, seq_lens: list[int]) -> dict:
    """Differences of two outputs [tokens, heads, dims]: count, max |diff|, the rows (with
    their context's tiles and the new token's place in its tile) and heads."""
    differ = a.float().ne(b.float()) & ~(a.isnan() & b.isnan())
    if not differ.any():
        return {"equal": True}
    rows = differ.any(2).any(1).nonzero().flatten().tolist()
    return {"equal": False, "elements": int(differ.sum()),
            "max_abs": float((a.float() - b.float()).abs().nan_to_num(float("inf"))[differ].max()),
            "max_ulps": max_ulps(a, b, differ),
            "nan_in": [name for name, t in (("first", a), ("second", b)) if t.isnan().any()],
            "rows": [{"row": r, "context": seq_lens[r] if r < len(seq_lens) else None,
                      "tiles": -(-seq_lens[r] // TILE_N) if r < len(seq_lens) else None,
                      "new_in_tile": (seq_lens[r] - 1) % TILE_N if r < len(seq_lens) else None,
                      "heads": differ[r].any(1).nonzero().flatten().tolist(),
                      "elements": int(differ[r].sum())} for r in rows[:16]],
            "rows_differing": len(rows)}


def max_ulps(a: torch.Tensor, b: torch.Tensor, differ: torch.Tensor) -> int | None:
    """The largest distance, in units of the last place, between differing 16-bit elements of
    the same sign (None for other dtypes)."""
    if a.element_size() != 2:
        return None
    bits_a, bits_b = (t.contiguous().view(torch.int16).int() for t in (a, b))
    same_sign = differ & ((bits_a < 0) == (bits_b < 0))
    return int((bits_a - bits_b).abs()[same_sign].max()) if same_sign.any() else None


def pool_where(a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor) -> dict:
    """Differences of two pools [blocks, block_size, KV heads, dims] (NaN equal to NaN):
    count, max |diff|, whether all lie in the new tokens' slots, the KV heads."""
    flat_a, flat_b = a.flatten(0, 1).float(), b.flatten(0, 1).float()
    differ = flat_a.ne(flat_b) & ~(flat_a.isnan() & flat_b.isnan())
    if not differ.any():
        return {"equal": True}
    at = differ.any(2).any(1).nonzero().flatten()
    new = set(slots[slots >= 0].tolist())
    return {"equal": False, "elements": int(differ.sum()),
            "max_abs": float((flat_a - flat_b).abs().nan_to_num(float("inf"))[differ].max()),
            "max_ulps": max_ulps(a.flatten(0, 1), b.flatten(0, 1), differ),
            "slots_differing": len(at), "all_in_new_slots": all(s in new for s in at.tolist()),
            "nan_in": [name for name, t in (("first", a), ("second", b)) if t.isnan().any()],
            "kv_heads": differ.any(2).any(0).nonzero().flatten().tolist()}


def compare(first, second, seq_lens, slots) -> dict:
    return {"out": out_where(first[0], second[0], seq_lens),
            "k_cache": pool_where(first[1], second[1], slots),
            "v_cache": pool_where(first[2], second[2], slots)}


def probes(rows: int, splits: int | None, norms: bool, one_stage: bool, device: str) -> dict:
    step, positions, cos_sin, weights, meta, seq_lens = build(rows, norms, device)
    slots = step.meta.slot_mapping
    chooser, config = triton_backend.choose_num_splits, triton_backend.fused_decode_config
    if splits is not None:
        triton_backend.choose_num_splits = lambda *args: splits
    try:
        inputs = (step, positions, cos_sin, weights, meta)
        pair, fold = run(False, *inputs), run(True, *inputs)
        found = {"as_tested": compare(pair, fold, seq_lens, slots),
                 "repeat_fold": compare(fold, run(True, *inputs), seq_lens, slots),
                 "repeat_pair": compare(pair, run(False, *inputs), seq_lens, slots),
                 "slot_prewritten": compare(pair, run(True, *inputs, caches=pair[1:]),
                                            seq_lens, slots)}
        zeros = (step, torch.zeros_like(positions), cos_sin, weights, meta)
        found["identity_rope"] = compare(run(False, *zeros), run(True, *zeros), seq_lens, slots)
        if one_stage:  # two more compiles: one case only
            triton_backend.fused_decode_config = lambda *a, **k: dataclasses.replace(
                config(*a, **k), num_stages=1)
            found["one_stage"] = compare(run(False, *inputs), run(True, *inputs), seq_lens,
                                         slots)
    finally:
        triton_backend.choose_num_splits, triton_backend.fused_decode_config = chooser, config
    return {"rows": rows, "splits": splits, "norms": norms, "seq_lens": seq_lens, **found}


def summary(case: dict) -> str:
    def word(result):
        return "/".join(name for name in ("out", "k_cache", "v_cache")
                        if not result[name]["equal"]) or "equal"
    return (f"rows {case['rows']} splits {case['splits']} norms {case['norms']}: "
            + ", ".join(f"{probe} {word(case[probe])}" for probe in
                        ("as_tested", "repeat_fold", "repeat_pair", "slot_prewritten",
                         "identity_rope", "one_stage") if probe in case))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="64,8:4",
                        help="rows[:splits] of each case, comma-separated (no splits: planned)")
    parser.add_argument("--device", default="cuda",
                        help="cpu: under TRITON_INTERPRET=1, to check the script")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    cases = []
    for spec in args.cases.split(","):
        rows, _, splits = spec.partition(":")
        for norms in (False, True):
            case = probes(int(rows), int(splits) if splits else None, norms, not cases,
                          args.device)
            print(summary(case), flush=True)
            cases.append(case)
    text = json.dumps({"cases": cases}, indent=1)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    print(text[:6000])


if __name__ == "__main__":
    main()
