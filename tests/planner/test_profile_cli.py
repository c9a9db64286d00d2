"""`parashift profile`'s output: what it does not time carried over from the committed
profile of the device's kind, and the summary of its fits."""
from dataclasses import replace

from parashift.cost.profile import load
from parashift.cost.shape import SHAPES
from parashift.planner.profile_cli import UNTIMED, summary, with_untimed

H200 = load(SHAPES.parent / "results" / "profiles" / "h200_compute.json")


def test_untimed_fields_come_from_the_committed_profile_of_the_kind():
    measured = replace(H200, device="NVIDIA H200", source="measured", sp_kernels_per_layer=0,
                       activation_bytes=1.0, notes={})
    carried = with_untimed(measured)
    assert all(getattr(carried, name) == getattr(H200, name) for name in UNTIMED)
    assert carried.notes["carried_over"].startswith(
        "activation_bytes, kernels_per_layer, sp_kernels_per_layer, tp_kernels_per_layer from "
        "h200_compute.json (derived from docs/benchmark_log.md")
    other = replace(measured, device="cpu")
    assert with_untimed(other) is other


def test_the_summary_names_every_fit():
    text = summary(H200)
    assert all(name in text for name in ("gemm", "decode_attention", "prefill_attention",
                                         "elementwise", "moe", "fp8_gemm", "host"))
