"""benchmarks/hf_compare.py's transformers twin holds parashift's weights: the same tokens,
dense (packed q/k/v and gate/up split back) and a mixture of experts (stacked experts)."""
import pytest
import torch

from parashift import LLM, SamplingParams
from tests.bench.benchmark_scripts import load_benchmark
from tests.helpers.tiny_configs import tiny_config


def hf_compare():
    return load_benchmark("hf_compare")


@pytest.mark.parametrize("family,architecture", [("llama-gqa-untied", "LlamaForCausalLM"),
                                                 ("qwen3-moe", "Qwen3MoeForCausalLM")])
def test_transformers_twin_gives_the_same_tokens(family, architecture, tmp_path):
    config = tiny_config(family)
    config.architectures = [architecture]
    config.save_pretrained(tmp_path)
    llm = LLM(model=str(tmp_path / "config.json"), dtype="float32", device="cpu",
              skip_tokenizer_init=True, max_model_len=128, enable_prefix_caching=False)
    hf = hf_compare().hf_model_like(llm, device="cpu", dtype=torch.float32)
    prompt = [3, 17, 5, 42, 8, 11]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    ours = llm.generate([prompt], params)[0].outputs[0].token_ids
    with torch.inference_mode():
        theirs = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=8,
                             min_new_tokens=8)[0, len(prompt):].tolist()
    assert ours == theirs
