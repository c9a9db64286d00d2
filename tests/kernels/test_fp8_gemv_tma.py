"""The FP8 GEMV with the weight streamed by TMA against an fp64 product of the dequantized
weight (test_fp8_gemv.py's check): one small case under the Triton interpreter, every
registered config on CUDA; on the GPU (PARASHIFT_TEST_DEVICE=cuda) an FP8 engine's greedy
tokens with it at one to four rows equal to those with fp8_gemv.py's GEMV there."""
import os

import pytest
import torch

from parashift.kernels import fp8_gemm
from parashift.kernels.fp8_gemv import MAX_ROWS
from parashift.kernels.fp8_gemv_tma import fp8_gemv_tma
from tests.deterministic.test_batch_invariance import GREEDY, requests
from tests.engine.conftest import tiny_llama_dir, tiny_llm  # noqa: F401  (shared fixture)
from tests.kernels import test_fp8_gemv
from tests.kernels.common import case_id, case_tests, cuda

DEVICE = os.environ.get("PARASHIFT_TEST_DEVICE", "cpu")

# (block_n, block_k, warps, stages, split_k, tickets): several row tiles and a partial last
# one (n 40), a partial last K step (k 208), K split in three by tickets (one part past K)
SMALL = ((16, 64, 4, 3, 1, False), (32, 32, 2, 2, 3, True))
# weight rows of 16-byte aligned columns (TMA's rule): k a multiple of 16, padded by 16
CASES = [dict(m=3, n=40, k=208, bias=True, padded=True)]
REGISTERED = [(c.block_n, c.block_k, c.num_warps, c.num_stages, c.split_k, c.tickets)
              for c in fp8_gemm.GEMV_TMA_CONFIGS]


def check(m, n, k, dtype="float32", device="cpu", configs=SMALL, **case):
    test_fp8_gemv.check(m, n, k, dtype=dtype, device=device, configs=configs,
                        gemv=fp8_gemv_tma, **case)


test_interpreted, _ = case_tests(__name__, check, CASES)


@cuda
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("case", [dict(m=1, n=300, k=4096), dict(m=4, n=96, k=1040, bias=True),
                                  dict(m=2, n=64, k=512, padded=True)], ids=case_id)
def test_cuda(case, dtype):
    """Every registered config in bf16 (decode's dtype), the first in the others."""
    check(**case, dtype=dtype, device="cuda",
          configs=REGISTERED if dtype == "bfloat16" else REGISTERED[:1])


def test_rejects_a_k_step_wider_than_a_tma_box():
    weight = torch.zeros(16, 512, dtype=fp8_gemm.FP8)
    with pytest.raises(ValueError, match="block_k <= 256"):
        fp8_gemv_tma(torch.zeros(1, 512), weight, torch.ones(16), None, 16, 512, 4, 2)


def only_family(kernel: str) -> tuple:
    """fp8_gemm's candidates and choice where a GEMV competes (1-4 rows): `kernel`'s configs
    alone (fewer compiles), the fastest of them; elsewhere the usual ones."""
    usual_candidates, usual_choice = fp8_gemm.candidates, fp8_gemm.choose

    def candidates(rows, n):
        configs = usual_candidates(rows, n)
        return [c for c in configs if c.kernel == kernel] if rows <= MAX_ROWS else configs

    def choose(timings):
        family = [c for c in timings if c is not None and c.kernel == kernel]
        return min(family, key=timings.__getitem__) if family else usual_choice(timings)
    return candidates, choose


def family_tokens(model_dir, kernel: str) -> tuple[list, list[str]]:
    """An FP8 engine's greedy tokens for 8 prompts (4 sequences at a time) with `kernel`'s
    configs at 1-4 rows, and the kernels chosen."""
    prompts, _ = requests(8)
    with pytest.MonkeyPatch.context() as patch:
        candidates, choose = only_family(kernel)
        patch.setattr(fp8_gemm, "candidates", candidates)
        patch.setattr(fp8_gemm, "choose", choose)
        patch.setattr(fp8_gemm, "_choices", {})
        llm = tiny_llm(model_dir, device=DEVICE, dtype="bfloat16", quantization="fp8",
                       max_num_seqs=4)
        try:
            outs = llm.generate(prompts, GREEDY)
            chosen = [c["kernel"] for c in fp8_gemm.chosen()]
        finally:
            llm.llm_engine.shutdown()
    return [o.outputs[0].token_ids for o in outs], chosen


@pytest.mark.skipif(DEVICE != "cuda", reason="needs PARASHIFT_TEST_DEVICE=cuda")
def test_engine_gives_the_register_gemvs_tokens(tiny_llama_dir):  # noqa: F811
    by_tma, chosen = family_tokens(tiny_llama_dir, "gemv_tma")
    assert any("gemv_tma" in kernel for kernel in chosen)
    assert by_tma == family_tokens(tiny_llama_dir, "gemv")[0]
