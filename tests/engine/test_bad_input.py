"""Bad input raises an error that names the problem and disturbs nothing else."""
import pytest

from parashift import LLM, SamplingParams
from tests.engine.conftest import tiny_llm


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return tiny_llm(tiny_llama_dir, max_model_len=64)


@pytest.mark.parametrize("prompt, message", [
    ([], "empty"),
    ([1] * 64, "max_model_len=64"),
    ([1, 2, 512], "out of vocabulary"),
    ([1, -1], "out of vocabulary"),
])
def test_bad_prompts(llm, prompt, message):
    with pytest.raises(ValueError, match=message):
        llm.generate([prompt], SamplingParams(max_tokens=2))


def test_bad_prompt_in_a_batch_leaves_no_stray_requests(llm):
    with pytest.raises(ValueError, match="out of vocabulary"):
        llm.generate([[1, 2, 3], [9999]], SamplingParams(max_tokens=2))
    assert not llm.llm_engine.has_unfinished_requests()
    out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 3


def test_prompt_filling_context_stops_at_max_model_len(llm):
    out = llm.generate([[1] * 60], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4 and out[0].outputs[0].finish_reason == "length"


@pytest.mark.parametrize("options, message", [
    (dict(temperature=-0.1), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=0), "top_k"),
    (dict(top_k=-2), "top_k"),
    (dict(min_p=-0.1), "min_p"),
    (dict(min_p=1.1), "min_p"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(stop=[""]), "stop"),
    (dict(stop=""), "stop"),
])
def test_bad_sampling_params(options, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**options)


def test_model_path_that_does_not_exist():
    with pytest.raises(FileNotFoundError, match="/no/such/model"):
        LLM(model="/no/such/model", device="cpu")


def test_unknown_engine_option(tiny_llama_dir):
    with pytest.raises(ValueError, match="tensor_paralel_size"):
        LLM(model=tiny_llama_dir, tensor_paralel_size=2)


def test_truncated_weight_file(tiny_llama_dir, tmp_path):
    import shutil
    broken = tmp_path / "broken"
    shutil.copytree(tiny_llama_dir, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError, match="model.safetensors"):
        tiny_llm(str(broken))


def test_cuda_graphs_need_a_gpu(tiny_llama_dir):
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        LLM(model=tiny_llama_dir, device="cpu", skip_tokenizer_init=True, cuda_graphs=True)
