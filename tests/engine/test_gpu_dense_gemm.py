"""The 16-bit TMA GEMM of decode at 33-64 rows (kernels/dense_gemm.py) in the engine: the
greedy tokens of cuBLAS's engine in bfloat16. Runs where CUDA is present."""
import random

import pytest
import torch

from parashift import LLM, SamplingParams
from parashift.kernels import dense_gemm

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
SEQUENCES = 40  # decode steps of 33-40 rows (eager: no graph capture, a shorter test)
VOCAB = 512
# a greedy token may differ where the reference's top two were this close (bf16 sums in
# another order); after that the sequences go their own ways
NEAR_TIE = 0.1


def _outputs(model_dir: str, tma: bool, monkeypatch) -> list:
    monkeypatch.setenv(dense_gemm.ENV, "1" if tma else "0")
    rng = random.Random(3)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(1, 200))]
               for _ in range(SEQUENCES)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)
    with LLM(model=model_dir, device="cuda", dtype="bfloat16", skip_tokenizer_init=True,
             kv_cache_memory=1 << 30, max_num_seqs=48, cuda_graphs=False) as llm:
        return [o.outputs[0] for o in llm.generate(prompts, params)]


def test_tma_gemm_keeps_the_greedy_tokens(monkeypatch, tmp_path):
    """With the TMA kernel taken for every shape it runs (a margin that always lets it win;
    a tiny random Llama with peaked logits), each sequence's tokens are cuBLAS's up to a near
    tie of the reference's logits."""
    from tests.engine.conftest import save_tiny_llama
    model_dir = save_tiny_llama(tmp_path, num_attention_heads=8, num_key_value_heads=2,
                                hidden_size=256, intermediate_size=512, num_hidden_layers=4)
    dense_gemm._choices.clear()
    monkeypatch.setattr(dense_gemm, "MARGIN", float("inf"))
    fast = _outputs(model_dir, True, monkeypatch)
    assert any(c["kernel"] != "cuBLAS" for c in dense_gemm.chosen())
    reference = _outputs(model_dir, False, monkeypatch)
    equal = 0
    for ref, got in zip(reference, fast):
        j = next((j for j, (a, b) in enumerate(zip(ref.token_ids, got.token_ids)) if a != b),
                 None)
        if j is None:
            equal += 1
            continue
        top = ref.logprobs[j]
        gap = top[ref.token_ids[j]] - top.get(got.token_ids[j], float("-inf"))
        assert gap < NEAR_TIE, (j, ref.token_ids, got.token_ids, top)
    assert equal >= SEQUENCES // 2
