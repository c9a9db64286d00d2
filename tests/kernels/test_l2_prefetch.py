"""The L2 prefetch kernel (kernels/l2_prefetch.py). On the CPU, compiled for sm_90: it touches
memory only by bulk L2 prefetches, issued after its grid dependency wait, and launches its
dependents once. On a Hopper GPU: a decode chain of norm, GEMMs and SiLU-and-mul captured in
a CUDA graph with the prefetches between its kernels gives the same bits as without, and
spans of any size and start run."""
import re

import pytest
import torch

from parashift.kernels import fp8_gemm, l2_prefetch, pdl
from tests.deterministic.test_kernels import compile_sm90
from tests.kernels.common import cuda, randn
from tests.kernels.test_pdl import decode_chain, hopper, weight_fp8

MEMORY_OP = re.compile(r"^\s*(@%p\d+\s+)?(ld\.global|st\.global|atom\.|red\.|prefetch\.|"
                       r"cp\.async\.bulk\.(?!prefetch))", re.M)
BULK = re.compile(r"cp\.async\.bulk\.prefetch\.L2\.global")


def sm90_ptx(mode: int) -> str:
    constants = dict(CHUNK=l2_prefetch.CHUNK, LANES=l2_prefetch.LANES, USE_PDL=mode)
    options = {"num_warps": 4, **({"launch_pdl": True} if mode else {})}
    return compile_sm90(l2_prefetch._l2_prefetch_kernel, constants,
                        {"a_ptr": "u8", "b_ptr": "u8"}, **options)["ptx"]


@pytest.mark.skipif(not pdl.triton_supports(), reason="this Triton has no grid dependency ops")
def test_only_bulk_prefetches_after_the_wait():
    ptx = sm90_ptx(pdl.EARLY)
    prefetches = [m.start() for m in BULK.finditer(ptx)]
    assert prefetches
    assert not MEMORY_OP.search(ptx)
    wait = ptx.find("griddepcontrol.wait")
    assert wait >= 0 and ptx.count("griddepcontrol.wait") == 1
    assert ptx.count("griddepcontrol.launch_dependents") == 1
    assert all(p > wait for p in prefetches)
    assert "griddepcontrol" not in sm90_ptx(pdl.OFF)


def test_more_than_two_spans_or_a_span_off_16_bytes_is_an_error():
    w = torch.zeros(64, dtype=torch.uint8)
    with pytest.raises(ValueError, match="two spans"):
        l2_prefetch.prefetch([l2_prefetch.Span(w, 0, 16)] * 3)
    for first, count in [(8, 16), (0, 24)]:
        with pytest.raises(ValueError, match="16 bytes"):
            l2_prefetch.prefetch([l2_prefetch.Span(w, first, count)])


@cuda
@hopper
def test_prefetches_of_any_span_run_and_write_nothing():
    w = randn((3001, 77), "bfloat16", "cuda")
    before = w.clone()
    size = w.numel() * 2 // 16 * 16  # 462,144 of 462,154 bytes
    for first, count in [(0, size), (16, 4096), (size - 48, 48), (1024, 300 * 1024)]:
        l2_prefetch.prefetch([l2_prefetch.Span(w, first, min(count, size - first)),
                              l2_prefetch.Span(w, 0, 16)])
    torch.cuda.synchronize()
    assert torch.equal(w, before)


@cuda
@hopper
def test_a_graph_of_a_decode_chain_gives_the_same_bits_with_prefetches(monkeypatch):
    d, ff = 1024, 2048
    x = randn((1, d), "bfloat16", "cuda")
    residual = randn((1, d), "bfloat16", "cuda", seed=1)
    norm_w = 1 + 0.1 * randn((d,), "bfloat16", "cuda", seed=2)
    w_up, w_down = weight_fp8(2 * ff, d, seed=3), weight_fp8(d, ff, seed=4)
    linear = fp8_gemm.fp8_weight_linear

    def prefetching(x, weight, *args):  # after each GEMM: the other's weight, some of its own
        y = linear(x, weight, *args)
        other = w_down[0] if weight is w_up[0] else w_up[0]
        l2_prefetch.prefetch([l2_prefetch.Span(other, 0, other.numel()),
                              l2_prefetch.Span(weight, 4096, 8192)])
        return y

    def graphed(prefetch: bool):
        monkeypatch.setattr(fp8_gemm, "fp8_weight_linear", prefetching if prefetch else linear)
        chain = lambda: decode_chain(x, residual, norm_w, None, w_up, w_down, 8, True)  # noqa
        chain()  # compiled outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = chain()
        graph.replay()
        torch.cuda.synchronize()
        return tuple(t.clone() for t in (out if isinstance(out, tuple) else (out,)))

    monkeypatch.setenv("PARASHIFT_PDL", "1")
    off, on = graphed(False), graphed(True)
    for a, b in zip(off, on, strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
