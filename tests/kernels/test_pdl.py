"""Programmatic dependent launch (kernels/pdl.py). On the CPU: the switch is off there and
under the interpreter, and each PDL-aware kernel compiled for sm_90 reads and writes global
memory only after its grid dependency wait (what makes PDL safe), prefetching its weights
before it, and lets its dependents launch where its mode says (early: before its first read;
late: after its inputs are read). On CUDA (Hopper): each kernel gives the same bits with PDL
off, early and late, eagerly and in a CUDA graph of a chain of decode kernels, and
(PARASHIFT_TEST_DEVICE=cuda) an engine's greedy tokens and logprobs are the same."""
import os
import re

import pytest
import torch
import triton

from parashift.attention import triton_decode, triton_decode_preload, triton_kernels
from parashift.kernels import (argmax, fp8_gated_tma, fp8_gemm, fp8_gemv, fused_moe, gemm_timing,
                               moe_prefill, moe_norm_router, moe_router, moe_routing, moe_small,
                               pdl, rmsnorm, rotary, silu_mul, skinny_gemm)
from tests.deterministic.test_kernels import compile_sm90
from tests.kernels.common import TRITON_TYPES, cuda, randn

DEVICE = os.environ.get("PARASHIFT_TEST_DEVICE", "cpu")


def test_pdl_is_off_on_the_cpu_under_the_interpreter_and_by_default(monkeypatch):
    monkeypatch.setenv("PARASHIFT_PDL", "late")
    assert not pdl.pdl_enabled(torch.device("cpu"))
    monkeypatch.setenv("PARASHIFT_PDL", "1")
    assert not pdl.pdl_enabled(torch.device("cpu"))
    assert pdl.launch_options(torch.device("cpu"), (8, 4096, 1)) == {"USE_PDL": False,
                                                                     "PREFETCH_K": 0}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not pdl.pdl_enabled(torch.device("cuda", 0))
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setenv("PARASHIFT_PDL", "0")
    assert not pdl.pdl_enabled(torch.device("cuda", 0))
    assert pdl.launch_options(torch.device("cuda", 0)) == {"USE_PDL": False}


def test_by_default_pdl_launches_early_without_a_prefetch_where_supported(monkeypatch):
    """What measured fastest on an H200 (session 41): early placement, no weight prefetch."""
    monkeypatch.delenv("PARASHIFT_PDL", raising=False)
    monkeypatch.delenv("PARASHIFT_PDL_PREFETCH_KB", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(pdl, "_device_supports", lambda index: True)
    assert pdl.pdl_mode(torch.device("cuda", 0)) == pdl.EARLY
    assert pdl.prefetch_bytes() == 0
    assert pdl.launch_options(torch.device("cuda", 0), (8, 4096, 1)) == {
        "USE_PDL": pdl.EARLY, "launch_pdl": True, "PREFETCH_K": 0}
    monkeypatch.setattr(pdl, "_device_supports", lambda index: False)  # e.g. an A100
    assert not pdl.pdl_enabled(torch.device("cuda", 0))


@pytest.mark.parametrize("flag,mode", [("0", pdl.OFF), ("1", pdl.EARLY), ("early", pdl.EARLY),
                                       ("late", pdl.LATE)])
def test_the_switch_picks_the_launch_placement(monkeypatch, flag, mode):
    monkeypatch.setattr(pdl, "_device_supports", lambda index: True)
    monkeypatch.setenv("PARASHIFT_PDL", flag)
    monkeypatch.setenv("PARASHIFT_PDL_PREFETCH_KB", "16")
    assert pdl.pdl_mode(torch.device("cuda", 0)) == mode
    options = pdl.launch_options(torch.device("cuda", 0), (8, 4096, 1))
    assert options["USE_PDL"] == mode and options.get("launch_pdl", False) == (mode != pdl.OFF)
    assert (options["PREFETCH_K"] > 0) == (mode != pdl.OFF)


def test_kernels_launch_without_pdl_while_it_is_suspended(monkeypatch):
    monkeypatch.setattr(pdl, "_device_supports", lambda index: True)
    monkeypatch.setenv("PARASHIFT_PDL", "late")
    cuda0 = torch.device("cuda", 0)
    with pdl.suspended():
        with pdl.suspended():
            assert pdl.launch_options(cuda0, (8, 4096, 1)) == {"USE_PDL": pdl.OFF,
                                                               "PREFETCH_K": 0}
        assert pdl.pdl_mode(cuda0) == pdl.OFF
    assert pdl.pdl_mode(cuda0) == pdl.LATE


@pytest.mark.parametrize("timing, suspended", [("graph", 1), ("flushed", 1), ("chain", 0),
                                               (None, 0)])
def test_gemms_time_their_choice_with_pdl_suspended_unless_in_the_chain(monkeypatch, timing,
                                                                        suspended):
    if timing is None:  # the default: the chain
        monkeypatch.delenv("PARASHIFT_GEMM_TIMING", raising=False)
    else:
        monkeypatch.setenv("PARASHIFT_GEMM_TIMING", timing)
    seen = []

    def timings(*args):
        seen.append(pdl._suspended)
        return {None: 1.0}
    for module in (skinny_gemm, fp8_gemm):
        monkeypatch.setattr(module, "timings_ms", timings)
        monkeypatch.setattr(module, "_choices", {})
    monkeypatch.setattr(fp8_gemm, "scaled_mm_linear", lambda x, w, *args: x @ w.float().t())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    x = torch.randn(2, 64)
    skinny_gemm.linear(x, torch.randn(32, 64), None)
    fp8_gemm.linear(x, torch.randn(32, 64).to(FP8), torch.ones(32, 1), None)
    assert seen == [suspended] * 2 and pdl._suspended == 0


def test_a_bad_switch_value_is_an_error_naming_it(monkeypatch):
    monkeypatch.setenv("PARASHIFT_PDL", "yes")
    with pytest.raises(ValueError, match="PARASHIFT_PDL='yes'"):
        pdl.pdl_enabled(torch.device("cuda", 0))
    monkeypatch.setenv("PARASHIFT_PDL", "0")
    for bad in ("-1", "16k", ""):
        monkeypatch.setenv("PARASHIFT_PDL_PREFETCH_KB", bad)
        with pytest.raises(ValueError, match=f"PARASHIFT_PDL_PREFETCH_KB='{bad}'"):
            pdl.prefetch_cols(16, 4096, 2)


@pytest.mark.parametrize("rows,k,elem", [(16, 4096, 2), (4, 14336, 1), (128, 4096, 1),
                                         (2, 100, 2), (1, 64, 1)])
@pytest.mark.parametrize("kb", [None, "4", "64"])
def test_prefetch_spans_whole_lines_of_about_the_budget(monkeypatch, rows, k, elem, kb):
    if kb is not None:
        monkeypatch.setenv("PARASHIFT_PDL_PREFETCH_KB", kb)
    budget = 1024 * int(kb or pdl.DEFAULT_PREFETCH_KB)
    assert pdl.prefetch_bytes() == budget
    cols = pdl.prefetch_cols(rows, k, elem)
    line = pdl.LINE_BYTES.value // elem
    assert cols & (cols - 1) == 0 and cols % line == 0
    assert cols <= max(line, triton.next_power_of_2(k))
    assert rows * cols * elem <= max(budget, rows * line * elem)
    if rows * line * elem <= budget // 2 and 2 * cols <= k:
        assert 2 * rows * cols * elem > budget  # not less than half the budget


def test_no_prefetch_where_its_budget_is_zero(monkeypatch):
    monkeypatch.setenv("PARASHIFT_PDL_PREFETCH_KB", "0")
    assert pdl.prefetch_cols(16, 4096, 2) == 0


# (kernel, pointer dtypes other than bf16, float scalars, constexprs, prefetches weights)
FP8 = torch.float8_e4m3fn
TICKET_POINTERS = {"part_ptr": torch.float32, "counter_ptr": torch.int32}
GEMV_POINTERS = {"w_ptr": FP8, "s_ptr": torch.float32, **TICKET_POINTERS}
GEMV_FLOATS = ()
GEMV_PLAIN = dict(EVICT_FIRST=False)
WEIGHT_POINTERS = {"x_ptr": FP8, "xs_ptr": torch.float32, "w_ptr": FP8, "s_ptr": torch.float32,
                   **TICKET_POINTERS}
KERNELS = {
    "skinny": (skinny_gemm._skinny_kernel, {}, (), dict(
        HAS_BIAS=True, IEEE=False, BLOCK_M=16, BLOCK_N=32, BLOCK_K=256, PREFETCH_K=256), True),
    "skinny_no_prefetch": (skinny_gemm._skinny_kernel, {}, (), dict(
        HAS_BIAS=True, IEEE=False, BLOCK_M=16, BLOCK_N=32, BLOCK_K=256, PREFETCH_K=0), False),
    "fp8_gemv": (fp8_gemv._fp8_gemv_kernel, GEMV_POINTERS, GEMV_FLOATS, dict(
        **GEMV_PLAIN,
        HAS_BIAS=False, ROWS=2, EVEN_K=True, BLOCK_N=4, BLOCK_K=2048, SPLIT_K=2, VEC=8,
        PREFETCH_K=4096, AHEAD=False, TICKETS=False), True),
    "fp8_gemv_ahead": (fp8_gemv._fp8_gemv_kernel, GEMV_POINTERS, GEMV_FLOATS, dict(
        **GEMV_PLAIN,
        HAS_BIAS=False, ROWS=2, EVEN_K=False, BLOCK_N=4, BLOCK_K=1024, SPLIT_K=2, VEC=8,
        PREFETCH_K=4096, AHEAD=True, TICKETS=False), True),
    "fp8_gemv_ahead_evict": (fp8_gemv._fp8_gemv_kernel, GEMV_POINTERS, GEMV_FLOATS, dict(
        **{**GEMV_PLAIN, "EVICT_FIRST": True},
        HAS_BIAS=False, ROWS=2, EVEN_K=False, BLOCK_N=4, BLOCK_K=1024, SPLIT_K=2, VEC=8,
        PREFETCH_K=4096, AHEAD=True, TICKETS=False), True),
    "fp8_gemv_silu_out": (fp8_gemv._fp8_gemv_kernel, GEMV_POINTERS, GEMV_FLOATS, dict(
        **GEMV_PLAIN,
        HAS_BIAS=False, ROWS=2, EVEN_K=True, BLOCK_N=16, BLOCK_K=512, SPLIT_K=1, VEC=8,
        PREFETCH_K=4096, AHEAD=False, TICKETS=False, SILU_OUT=True, LIBDEVICE=True), True),
    "fp8_gemv_tickets": (fp8_gemv._fp8_gemv_kernel, GEMV_POINTERS, GEMV_FLOATS, dict(
        **GEMV_PLAIN,
        HAS_BIAS=True, ROWS=2, EVEN_K=True, BLOCK_N=4, BLOCK_K=2048, SPLIT_K=2, VEC=8,
        PREFETCH_K=4096, AHEAD=False, TICKETS=True), True),
    "fp8_weight": (fp8_gemm._fp8_weight_kernel, WEIGHT_POINTERS, (),
                   dict(HAS_BIAS=False, FP8_X=True, BLOCK_M=64, BLOCK_N=64, BLOCK_K=256,
                        SPLIT_K=1, PREFETCH_K=256, TICKETS=False, EARLY_SCALES=False),
                   True),
    "fp8_weight_tickets": (fp8_gemm._fp8_weight_kernel, WEIGHT_POINTERS, (),
                           dict(HAS_BIAS=True, FP8_X=True, BLOCK_M=64, BLOCK_N=64,
                                BLOCK_K=256, SPLIT_K=4, PREFETCH_K=256, TICKETS=True,
                                EARLY_SCALES=False), True),
    # the tile's scales and bias loaded before the main loop (after the wait still)
    "fp8_weight_early_scales": (fp8_gemm._fp8_weight_kernel, WEIGHT_POINTERS, (),
                                dict(HAS_BIAS=True, FP8_X=True, BLOCK_M=64, BLOCK_N=64,
                                     BLOCK_K=256, SPLIT_K=4, PREFETCH_K=256, TICKETS=True,
                                     EARLY_SCALES=True), True),
    "argmax": (argmax._argmax_kernel, {"out_ptr": torch.int64, "part_value_ptr": torch.float32,
                                       "part_index_ptr": torch.int32, "counter_ptr": torch.int32},
               (), dict(BLOCK=4096, PARTS=32), False),
    "write_input": (gemm_timing._write_input_kernel, {}, (), dict(BLOCK=1024), False),
    "quantize_rows": (fp8_gemm._quantize_rows_kernel, {"q_ptr": FP8, "s_ptr": torch.float32},
                      (), dict(FP8_MAX=448.0, BLOCK_K=4096), False),
    "rms_norm_fp8": (rmsnorm._rms_norm_kernel, {"q_ptr": FP8, "s_ptr": torch.float32},
                     ("eps",), dict(N=4096, BLOCK=4096, HAS_RESIDUAL=True, QUANT=True,
                                    FP8_MAX=448.0, VEC=8, EARLY_LOADS=True), False),
    "rotary": (rotary._rotary_kernel, {"positions_ptr": torch.int64, "cos_sin_ptr":
                                       torch.float32, "slot_mapping_ptr": torch.int64}, (),
               dict(HALF=64, HALF_P=64, Q_HEADS_P=32, K_HEADS_P=8, WRITE_KV=True,
                    BLOCK_SIZE=16, QK_NORM=False, EARLY_LOADS=True), False),
    "rotary_qk_norm": (rotary._rotary_kernel, {"positions_ptr": torch.int64, "cos_sin_ptr":
                                               torch.float32, "slot_mapping_ptr": torch.int64},
                       ("eps",), dict(HALF=64, HALF_P=64, Q_HEADS_P=32, K_HEADS_P=4,
                                      WRITE_KV=True, BLOCK_SIZE=16, QK_NORM=True,
                                      EARLY_LOADS=True), False),
    # an FP8 router weight: its first tile's loads before the wait are then byte loads
    "moe_router": (moe_router._router_kernel, {
        "w_ptr": FP8, "logits_ptr": torch.float32, "ids_ptr": torch.int64,
        "counter_ptr": torch.int32}, (), dict(ROWS=1, BLOCK_E=1, BLOCK_K=2048, EXPERTS=128,
                                              PROGRAMS=128, TOP_K=8, RENORMALIZE=True), False),
    # the router row and the norm weight loaded before the wait, the logits read back
    "moe_norm_router": (moe_norm_router._norm_router_kernel, {
        "logits_ptr": torch.float32, "ids_ptr": torch.int64, "counter_ptr": torch.int32},
        ("eps",), dict(N=2048, BLOCK=2048, VEC=8, EXPERTS=128, TOP_K=8, RENORMALIZE=True),
        False),
    "moe_route": (moe_routing._route_kernel, {"weights_ptr": torch.bfloat16,
                                              "ids_ptr": torch.int64}, (),
                  dict(TOP_K=8, EXPERTS=128, RENORMALIZE=True), False),
    "moe_sort_pairs": (moe_routing._sort_pairs_kernel, {
        "ids_ptr": torch.int64, "pair_of_row_ptr": torch.int64, "block_expert_ptr": torch.int64},
        (), dict(PAIRS=128, EXPERTS=128, BLOCK_M=16, FILL=256, BLOCKS=16), False),
    "moe_count_pairs": (moe_routing._count_pairs_kernel, {"ids_ptr": torch.int64,
                                                          "counts_ptr": torch.int32}, (),
                        dict(CHUNK=1024), False),
    "moe_place_pairs": (moe_routing._place_pairs_kernel, {
        "ids_ptr": torch.int64, "counts_ptr": torch.int32, "pair_of_row_ptr": torch.int64,
        "block_expert_ptr": torch.int64}, (),
        dict(EXPERTS=128, CHUNKS=4, BLOCK_M=16, CHUNK=1024), False),
    "moe_grouped_gemm": (fused_moe._grouped_gemm_kernel, {
        "pair_ptr": torch.int64, "block_expert_ptr": torch.int64}, (), dict(
            BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, MUL_WEIGHT=True, IEEE=False,
            W_SCALED=False, N_FIRST=0, SPLIT_TAIL=0, TMA=0), False),
    "moe_gate_up_silu": (moe_prefill._gate_up_silu_kernel, {
        "pair_ptr": torch.int64, "block_expert_ptr": torch.int64}, (), dict(
            BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, IEEE=False, W_SCALED=False, LIBDEVICE=True,
            N_FIRST=0, SPLIT_TAIL=0, TMA=0), False),
    "moe_topk_sum": (moe_prefill._topk_sum_kernel, {"ids_ptr": torch.int64}, (),
                     dict(TOP_K=8, BLOCK=1024), False),
    "moe_small_gate_up": (moe_small._gate_up_kernel, {"ids_ptr": torch.int64}, (), dict(
        BLOCK_N=16, BLOCK_K=256, VEC=8, W_SCALED=False, EVEN_K=True, LIBDEVICE=True), False),
    "moe_small_down": (moe_small._down_kernel, {"ids_ptr": torch.int64}, (), dict(
        TOP_K=8, BLOCK_N=16, BLOCK_K=128, VEC=8, W_SCALED=False, EVEN_K=True), False),
    "silu_mul": (silu_mul._silu_and_mul_kernel, {}, (), dict(BLOCK=1024, LIBDEVICE=True),
                 False),
    "silu_mul_fp8_split": (silu_mul._silu_and_mul_fp8_split_kernel, {
        "q_ptr": FP8, "s_ptr": torch.float32, "part_max_ptr": torch.float32,
        "ticket_ptr": torch.int32}, (), dict(FP8_MAX=448.0, BLOCK=2048, QUANT_BLOCK=16384,
                                             PARTS=8, BLOCKED=False, LIBDEVICE=True), False),
    # gate_up with SiLU·mul in its TMA epilogue: the weight's rows prefetched, its tiles and the
    # tokens' by TMA (cp.async.bulk) after the wait (DESCRIPTORS: the tensor descriptors)
    "fp8_gated_tma": (fp8_gated_tma._gated_tma_kernel, {
        "xs_ptr": torch.float32, "w_ptr": FP8, "s_ptr": torch.float32,
        "max_ptr": torch.float32}, (), dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, NUM_STAGES=3,
                                            LIBDEVICE=True, PREFETCH_K=256, PART_MAX=True),
        True),
    "quantize_by_parts": (fp8_gated_tma._quantize_by_parts_kernel, {
        "max_ptr": torch.float32, "q_ptr": FP8, "s_ptr": torch.float32}, (),
        dict(FP8_MAX=448.0, PARTS=128, BLOCK=2048), False),
    "silu_mul_fp8_row": (silu_mul._silu_and_mul_fp8_row_kernel, {
        "q_ptr": FP8, "s_ptr": torch.float32}, (), dict(
            FP8_MAX=448.0, BLOCK=2048, BLOCKED=False, LIBDEVICE=True), False),
    "paged_attention": (triton_kernels.paged_attention_kernel, {
        "part_acc_ptr": torch.float32, "part_m_ptr": torch.float32,
        "part_l_ptr": torch.float32, "block_tables_ptr": torch.int32,
        "seq_lens_ptr": torch.int32, "query_start_loc_ptr": torch.int32}, ("qk_scale",), dict(
            GROUP=4, GROUP_P=4, BLOCK_Q=1, BLOCK_M=16, TILE_N=64, BLOCK_SIZE=16,
            HEAD_DIM=128, HEAD_DIM_P=128, SPLIT=True, DOT_PRECISION="tf32",
            MASK_EVERY_TILE=False, PARTITION_TILES=0, CONTEXT_SPLITS=64), False),
    "decode_attention": (triton_decode.decode_attention_kernel, {
        "part_acc_ptr": torch.float32, "part_m_ptr": torch.float32,
        "part_l_ptr": torch.float32, "ticket_ptr": torch.int32, "block_tables_ptr": torch.int32,
        "seq_lens_ptr": torch.int32, "query_start_loc_ptr": torch.int32}, ("qk_scale",), dict(
            GROUP=4, GROUP_P=4, BLOCK_M=16, TILE_N=64, BLOCK_SIZE=16, HEAD_DIM=128,
            HEAD_DIM_P=128, SPLITS_P=4, SPLIT_TOKENS=128, DOT_PRECISION="tf32",
            HEADS_FIRST=False, FP8_PAIRS=False, FP8_F16=False), False),
    "decode_attention_fp8_pairs": (triton_decode.decode_attention_kernel, {
        "part_acc_ptr": torch.float32, "part_m_ptr": torch.float32,
        "part_l_ptr": torch.float32, "ticket_ptr": torch.int32, "block_tables_ptr": torch.int32,
        "seq_lens_ptr": torch.int32, "query_start_loc_ptr": torch.int32, "k_cache_ptr": FP8,
        "v_cache_ptr": FP8}, ("qk_scale",), dict(
            GROUP=4, GROUP_P=4, BLOCK_M=16, TILE_N=64, BLOCK_SIZE=16, HEAD_DIM=128,
            HEAD_DIM_P=128, SPLITS_P=4, SPLIT_TOKENS=128, DOT_PRECISION="tf32",
            HEADS_FIRST=False, FP8_PAIRS=True, FP8_F16=False), False),
    "reduce_splits": (triton_kernels.reduce_splits_kernel, {
        "part_acc_ptr": torch.float32, "part_m_ptr": torch.float32,
        "part_l_ptr": torch.float32, "query_start_loc_ptr": torch.int32,
        "seq_lens_ptr": torch.int32}, (), dict(
            NUM_SPLITS=4, NUM_SPLITS_P=4, HEAD_DIM=128, HEAD_DIM_P=128, CONTEXT_SPLITS=64,
            EARLY_LOADS=True), False),
}
PRELOAD_POINTERS = {
    "part_acc_ptr": torch.float32, "part_m_ptr": torch.float32, "part_l_ptr": torch.float32,
    "block_tables_ptr": torch.int32, "seq_lens_ptr": torch.int32,
    "query_start_loc_ptr": torch.int32, "positions_ptr": torch.int64,
    "cos_sin_ptr": torch.float32, "slot_mapping_ptr": torch.int64}
PRELOAD_CONSTEXPRS = dict(GROUP=4, GROUP_P=4, BLOCK_M=16, TILE_N=64, BLOCK_SIZE=16,
                          HEAD_DIM=128, HEAD_DIM_P=128, SPLIT_TOKENS=64, DOT_PRECISION="tf32",
                          PREFETCH_TILES=2, ROW_LINES=2, LINE_ELEMS=64, NEW_FIRST=False,
                          FP8_PAIRS=False)
KERNELS.update({
    "preloaded_decode": (triton_decode_preload.preloaded_decode_kernel, PRELOAD_POINTERS,
                         ("qk_scale", "eps"), dict(**PRELOAD_CONSTEXPRS, ROPE=False), True),
    "preloaded_decode_rope": (triton_decode_preload.preloaded_decode_kernel, PRELOAD_POINTERS,
                              ("qk_scale", "eps"), {**PRELOAD_CONSTEXPRS, "ROPE": True,
                                                    "QK_NORM": True, "NEW_FIRST": True}, True),
    "preloaded_decode_fp8_pairs": (
        triton_decode_preload.preloaded_decode_kernel,
        {**PRELOAD_POINTERS, "k_cache_ptr": FP8, "v_cache_ptr": FP8}, ("qk_scale", "eps"),
        {**PRELOAD_CONSTEXPRS, "ROPE": True, "QK_NORM": False, "FP8_PAIRS": True}, True),
})


POINTER_TYPES = {**TRITON_TYPES, torch.int32: "i32", torch.int64: "i64"}


# the kernels that read their own output back after a barrier (or a ticket): LATE is after
# their inputs' reads, before those
READ_BACK = {"argmax", "silu_mul_fp8_split", "silu_mul_fp8_row", "fp8_gemv_tickets",
             "fp8_weight_tickets", "fp8_weight_early_scales", "moe_router", "moe_norm_router",
             "decode_attention", "decode_attention_fp8_pairs"}
# the kernels that load their first weight tile before the wait (the weight is no earlier
# kernel's output): there they load E4M3 bytes only (compiled without alignment hints, one
# byte a load; the activations are bf16), and nothing else touches memory
WEIGHT_FIRST = {"fp8_gemv_ahead", "fp8_gemv_ahead_evict", "moe_router"}
WEIGHT_BYTE_LOAD = re.compile(r"^\s*(@%p\d+\s+)?ld\.global(\.L[12]::[\w:]+)*\.b8\b", re.M)
# the kernels that load, before the wait, what no kernel before them writes and touch memory
# no other way there: the norm weight; positions, cos, sin and slots; a decode's metadata,
# block table and older KV
LOADS_FIRST = {"rms_norm_fp8", "rotary", "rotary_qk_norm", "moe_norm_router", "decode_attention",
               "decode_attention_fp8_pairs", "preloaded_decode_fp8_pairs",
               "preloaded_decode", "preloaded_decode_rope", "reduce_splits"}


# the tensor-descriptor arguments of KERNELS' kernels that take them
DESCRIPTORS = {fp8_gated_tma._gated_tma_kernel: {"x_desc": "tensordesc<fp8e4nv[64, 128]>",
                                                 "w_desc": "tensordesc<fp8e4nv[128, 128]>"}}


def sm90_ptx(kernel, pointers: dict, floats: tuple, constexprs: dict, mode: int) -> str:
    """The kernel's PTX for sm_90, compiled on the CPU; pointers bf16 unless named."""
    elements = {name: POINTER_TYPES[pointers.get(name, torch.bfloat16)]
                for name in (p.name for p in kernel.params) if name.endswith("_ptr")}
    options = {"num_warps": 4, **({"launch_pdl": True} if mode else {})}
    return compile_sm90(kernel, {**constexprs, "USE_PDL": mode}, elements, floats,
                        types=DESCRIPTORS.get(kernel), **options)["ptx"]


MEMORY_OP = re.compile(r"^\s*(@%p\d+\s+)?(ld\.global|st\.global|atom\.|red\.|cp\.async)", re.M)
LOAD = re.compile(r"^\s*(@%p\d+\s+)?ld\.global", re.M)


@pytest.mark.skipif(not pdl.triton_supports(), reason="this Triton has no grid dependency ops")
@pytest.mark.parametrize("mode", [pdl.EARLY, pdl.LATE], ids=["early", "late"])
@pytest.mark.parametrize("name", KERNELS)
def test_kernels_touch_memory_only_after_their_grid_wait(name, mode):
    kernel, pointers, floats, constexprs, prefetches = KERNELS[name]
    ptx = sm90_ptx(kernel, pointers, floats, constexprs, mode)
    wait = ptx.find("griddepcontrol.wait")
    assert wait >= 0 and ptx.count("griddepcontrol.wait") == 1
    early = [m for m in MEMORY_OP.finditer(ptx) if m.start() < wait]
    if name in WEIGHT_FIRST:
        assert early and all(WEIGHT_BYTE_LOAD.match(ptx, m.start()) for m in early), \
            [m.group(0) for m in early]
    elif name in LOADS_FIRST:
        assert early and all(LOAD.match(ptx, m.start()) for m in early), \
            [m.group(0) for m in early]
    else:
        assert not early, early[0].group(0)
    launch = ptx.find("griddepcontrol.launch_dependents")
    assert launch > wait and ptx.count("griddepcontrol.launch_dependents") == 1
    loads = [m.start() for m in LOAD.finditer(ptx) if m.start() > wait]
    if mode == pdl.EARLY:  # before it reads anything
        assert not loads or launch < loads[0]
    else:  # after its inputs: every load, or the first where it reads its output back
        assert loads and launch > (loads[0] if name in READ_BACK else loads[-1])
    prefetch = ptx.find("prefetch.global.L2")
    assert (0 <= prefetch < wait) if prefetches else prefetch < 0


@pytest.mark.parametrize("name", ["skinny", "rms_norm_fp8", "paged_attention"])
def test_kernels_without_pdl_have_none_of_its_instructions(name):
    kernel, pointers, floats, constexprs, _ = KERNELS[name]
    plain = sm90_ptx(kernel, pointers, floats, constexprs, pdl.OFF)
    assert "griddepcontrol" not in plain and "prefetch.global" not in plain


# ---- on a Hopper GPU: the same bits with PDL on and off ----
hopper = pytest.mark.skipif(not torch.cuda.is_available()
                            or torch.cuda.get_device_capability()[0] < 9,
                            reason="needs a CUDA device of compute capability 9 or more")


# (PARASHIFT_PDL, PARASHIFT_PDL_PREFETCH_KB): off, then on in each placement (benchmarks/
# pdl_chain.py compares the bits of its variants without the prefetch too)
SETTINGS = (("0", "16"), ("1", "16"), ("late", "16"))


def on_and_off(monkeypatch, fn):
    """fn() with PDL off, then on in each placement (asserting it is on), each result
    cloned."""
    results = []
    for flag, kb in SETTINGS:
        monkeypatch.setenv("PARASHIFT_PDL", flag)
        monkeypatch.setenv("PARASHIFT_PDL_PREFETCH_KB", kb)
        assert pdl.pdl_mode(torch.device("cuda")) == pdl.MODES[flag]
        out = fn()
        out = out if isinstance(out, tuple) else (out,)
        results.append(tuple(t.clone() for t in out))
    torch.cuda.synchronize()
    return results


def assert_same_bits(results) -> None:
    off, *ons = results
    assert ons
    for on in ons:
        for a, b in zip(off, on, strict=True):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def weight_fp8(n, k, seed):
    w = randn((n, k), "float32", "cuda", seed=seed) * 0.05
    scale = w.abs().amax(1, keepdim=True) / 448.0
    return (w / scale).to(FP8), scale


# the GEMV at one and several splits, the tl.dot kernel widening the weight and multiplying
# FP8 by FP8, split in two (more splits add their atomic partial sums in the order of their
# timing: not the same bits run to run), the GEMV a tile ahead, and K split by tickets (the
# parts summed in split order: the same bits at any split count)
FP8_CONFIGS = (fp8_gemm.GEMV_CONFIGS[0], fp8_gemm.GEMV_CONFIGS[6], fp8_gemm.CONFIGS[0],
               fp8_gemm.CONFIGS[9], fp8_gemm.CONFIGS[15], fp8_gemm.GEMV_CONFIGS[8],
               fp8_gemm.GEMV_CONFIGS[13], fp8_gemm.CONFIGS[19])


@cuda
@hopper
def test_weight_kernels_give_the_same_bits_with_pdl(monkeypatch):
    assert [c.split_k for c in FP8_CONFIGS] == [1, 2, 1, 1, 2, 1, 2, 4]
    assert [(c.ahead, c.tickets) for c in FP8_CONFIGS[-3:]] == [(True, False), (False, True),
                                                                 (False, True)]
    x = randn((2, 4096), "bfloat16", "cuda")
    w = randn((1536, 4096), "bfloat16", "cuda", seed=1, scale=0.02)
    w8, s8 = weight_fp8(1536, 4096, seed=2)
    for config in skinny_gemm.CONFIGS[:2]:
        assert_same_bits(on_and_off(monkeypatch, lambda: skinny_gemm.skinny_linear(
            x, w, None, config)))
    for config in FP8_CONFIGS:
        assert_same_bits(on_and_off(monkeypatch, lambda: fp8_gemm.fp8_weight_linear(
            x, w8, s8, None, config)))


@cuda
@hopper
def test_the_gated_gate_up_gives_the_same_bits_with_pdl(monkeypatch):
    """SiLU·mul in FP8 gate_up's TMA epilogue (its prefetch on) and down's rows both ways,
    and in bf16 gate_up's."""
    from parashift.kernels import dense_gated_choice, fp8_gated_choice
    x = randn((64, 4096), "bfloat16", "cuda")
    xq, xs = fp8_gemm.quantize_rows(x)
    w8, s8 = weight_fp8(2 * 1024, 4096, seed=2)
    for tiling in (fp8_gated_choice.Tiling(128, 128, 8, 4),
                   fp8_gated_choice.Tiling(64, 256, 4, 3, by_parts=True)):
        assert_same_bits(on_and_off(monkeypatch, lambda: fp8_gated_choice.fused(
            (xq, xs), w8, s8, torch.bfloat16, tiling)))
    w = randn((2 * 1024, 4096), "bfloat16", "cuda", seed=2, scale=4096 ** -0.5)
    assert_same_bits(on_and_off(monkeypatch, lambda: dense_gated_choice.fused(
        x, w, dense_gated_choice.Tiling(64, 128, 4, 4))))


@cuda
@hopper
def test_elementwise_and_norm_kernels_give_the_same_bits_with_pdl(monkeypatch):
    x, r = randn((64, 4096), "bfloat16", "cuda"), randn((64, 4096), "bfloat16", "cuda", seed=1)
    weight = 1 + 0.1 * randn((4096,), "bfloat16", "cuda", seed=2)
    gate_up = randn((64, 2 * 14336), "bfloat16", "cuda", seed=3)
    for fn in (lambda: rmsnorm.add_rms_norm(x, r, weight, 1e-5),
               lambda: rmsnorm.rms_norm_fp8(x, r, weight, 1e-5),
               lambda: fp8_gemm.quantize_rows(x),
               lambda: silu_mul.silu_and_mul(gate_up),
               lambda: silu_mul.silu_and_mul_fp8(gate_up, split=True),
               lambda: silu_mul.silu_and_mul_fp8(gate_up, split=False)):
        assert_same_bits(on_and_off(monkeypatch, fn))


@cuda
@hopper
def test_rotary_and_attention_give_the_same_bits_with_pdl(monkeypatch):
    from parashift.attention.triton_backend import TritonAttentionBackend
    from tests.attention.test_triton_backend import make_step, run
    step = make_step([1] * 8, [37, 300, 1, 1024, 64, 2000, 17, 700], num_heads=32,
                     num_kv_heads=8)
    positions = step.meta.seq_lens.long() - 1
    cos_sin = randn((4096, 128), "float32", "cuda", seed=4)
    k, v = step.k.clone(), step.v.clone()

    def rotate():
        k_cache, v_cache = step.k_cache.clone(), step.v_cache.clone()
        q = rotary.rotate_and_write_kv(positions, step.q, k, v, cos_sin, k_cache, v_cache,
                                       step.meta.slot_mapping)
        return q, k_cache.nan_to_num(), v_cache.nan_to_num()
    assert_same_bits(on_and_off(monkeypatch, rotate))
    for invariant in (False, True):
        backend = TritonAttentionBackend(batch_invariant=invariant)
        assert_same_bits(on_and_off(monkeypatch, lambda: run(backend, step)))


@cuda
@hopper
def test_moe_decode_kernels_give_the_same_bits_with_pdl(monkeypatch):
    """The one-launch router, the q/k norms in the RoPE kernel, the small-batch experts, the
    routing kernel and the grouped experts (the pair sort, two grouped GEMMs)."""
    from parashift.kernels import moe_routing
    x = randn((2, 2048), "bfloat16", "cuda")
    gate = randn((128, 2048), "bfloat16", "cuda", seed=1, scale=0.05)
    gate_up = randn((128 * 2 * 256, 2048), "bfloat16", "cuda", seed=2, scale=0.02)
    down = randn((128 * 2048, 256), "bfloat16", "cuda", seed=3, scale=0.05)
    weights, ids = moe_routing.route(x @ gate.t(), 8, True)
    qkv = randn((2, 40 * 128), "bfloat16", "cuda", seed=4)
    q, k, v = (t.unflatten(-1, (-1, 128)) for t in qkv.split([32 * 128, 4 * 128, 4 * 128], -1))
    norm_w = 1 + 0.1 * randn((128,), "bfloat16", "cuda", seed=5)
    cos_sin = randn((4096, 128), "float32", "cuda", seed=6)
    positions = torch.tensor([5, 3000], device="cuda")
    for fn in (lambda: moe_router.route_from_hidden(x, gate, 8, True),
               lambda: moe_small.small_experts(x, weights, ids, gate_up.view(128, 512, 2048),
                                               down.view(128, 2048, 256)),
               lambda: rotary.apply_rotary(positions, q, k, cos_sin, (norm_w, norm_w, 1e-6)),
               lambda: moe_routing.route(x @ gate.t(), 8, True),
               lambda: fused_moe.grouped_experts(x, weights, ids, gate_up.view(128, 512, 2048),
                                                 down.view(128, 2048, 256))):
        assert_same_bits(on_and_off(monkeypatch, fn))


def decode_chain(x, residual, norm_w, w_qkv, w_up, w_down, layers, fp8):
    """A decode layer's kernels without attention, `layers` times: norm, a projection,
    SiLU-and-mul, a projection (FP8 weights: fp8_gemm's kernels, the norm quantizing)."""
    for _ in range(layers):
        if fp8:
            h, residual, xq, xs = rmsnorm.rms_norm_fp8(x, residual, norm_w, 1e-5)
            up_config, down_config = CHAIN_FP8_CONFIGS[h.shape[0] > 4]
            up = fp8_gemm.fp8_weight_linear(h, *w_up, None, up_config, (xq, xs))
            act = silu_mul.silu_and_mul(up)
            x = fp8_gemm.fp8_weight_linear(act, *w_down, None, down_config)
        else:
            h, residual = rmsnorm.add_rms_norm(x, residual, norm_w, 1e-5)
            up = skinny_gemm.skinny_linear(h, w_up, None, skinny_gemm.CONFIGS[1])
            act = silu_mul.silu_and_mul(up)
            x = skinny_gemm.skinny_linear(act, w_down, None, skinny_gemm.CONFIGS[1])
    return x, residual


# (gate_up, down) at up to 4 rows, and at more: the down projection split in two (its
# output zeroed by a torch kernel, a non-PDL one, before it)
CHAIN_FP8_CONFIGS = {False: (fp8_gemm.GEMV_CONFIGS[1], fp8_gemm.GEMV_CONFIGS[6]),
                     True: (fp8_gemm.CONFIGS[12], fp8_gemm.CONFIGS[15])}


@cuda
@hopper
@pytest.mark.parametrize("fp8,rows", [(False, 1), (True, 1), (True, 16)])
def test_a_graph_of_a_decode_chain_gives_the_same_bits_with_pdl(monkeypatch, fp8, rows):
    d, ff = 1024, 2048
    x = randn((rows, d), "bfloat16", "cuda")
    residual = randn((rows, d), "bfloat16", "cuda", seed=1)
    norm_w = 1 + 0.1 * randn((d,), "bfloat16", "cuda", seed=2)
    if fp8:
        w_up, w_down = weight_fp8(2 * ff, d, seed=3), weight_fp8(d, ff, seed=4)
    else:
        w_up = randn((2 * ff, d), "bfloat16", "cuda", seed=3, scale=0.03)
        w_down = randn((d, ff), "bfloat16", "cuda", seed=4, scale=0.03)

    def chain():
        return decode_chain(x, residual, norm_w, None, w_up, w_down, 8, fp8)

    def graphed():
        chain()  # compiled outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = chain()
        for t in (x, residual):
            t.copy_(randn(tuple(t.shape), "bfloat16", "cuda", seed=9))
        graph.replay()
        return out
    results = on_and_off(monkeypatch, graphed)
    assert_same_bits(results)
    monkeypatch.setenv("PARASHIFT_PDL", "0")
    assert_same_bits((chain(), results[-1]))  # the graph replayed the new inputs, eager too


@pytest.fixture(scope="module")
def engine_outputs(tmp_path_factory):
    """A bf16 and an FP8 engine's outputs on the GPU with PDL off, early and late (CUDA
    graphs)."""
    from tests.deterministic.test_batch_invariance import GREEDY, requests
    from tests.engine.conftest import save_tiny_llama, tiny_llm
    prompts, _ = requests(8)
    model_dir = save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))
    outputs = {}
    with pytest.MonkeyPatch.context() as patch:
        for quantization in (None, "fp8"):
            for flag in ("0", "1", "late"):
                patch.setenv("PARASHIFT_PDL", flag)
                llm = tiny_llm(model_dir, device=DEVICE, dtype="bfloat16",
                               quantization=quantization, max_num_seqs=8)
                try:
                    outputs[quantization, flag] = llm.generate(prompts, GREEDY)
                finally:
                    llm.llm_engine.shutdown()
    return outputs


@pytest.mark.skipif(DEVICE != "cuda", reason="needs PARASHIFT_TEST_DEVICE=cuda")
@pytest.mark.parametrize("flag", ["1", "late"])
@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_engine_tokens_and_logprobs_are_the_same_with_pdl(engine_outputs, quantization, flag):
    from tests.deterministic.test_batch_invariance import assert_identical
    assert_identical(engine_outputs[quantization, flag], engine_outputs[quantization, "0"])
