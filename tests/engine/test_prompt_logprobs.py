"""SamplingParams(prompt_logprobs=k): RequestOutput.prompt_logprobs as vLLM's (None, then
{token id: Logprob} per prompt token), equal to Hugging Face's log-softmax of the prompt's
logits for the embedded SmolLM2, through chunked prefill and a prefix-cache hit."""
import pytest
import torch

from parashift import LLM, SamplingParams
from parashift.outputs import Logprob
from tests.conftest import requires_smollm2
from tests.engine.conftest import tiny_llama_dir, tiny_llm  # noqa: F401  (shared fixture)
from tests.helpers.hf_smollm2 import hf_smollm2

pytestmark = [requires_smollm2, pytest.mark.usefixtures("single_torch_thread")]
PROMPTS = ["The quick brown fox jumps over the lazy dog because it was tired of running",
           "Paris is the capital of"]
TOP = 3


@pytest.fixture(scope="module")
def llm() -> LLM:
    # a budget of 8 tokens a step: the prompts are prefilled in chunks
    return LLM(device="cpu", dtype="float32", num_blocks=64, max_model_len=256,
               attention_backend="torch", enable_prefix_caching=True, block_size=4,
               max_num_batched_tokens=8, long_prefill_token_threshold=8, max_num_seqs=4)


@pytest.fixture(scope="module")
def hf_model():
    return hf_smollm2()


@torch.inference_mode()
def hf_log_softmax(model, token_ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([token_ids])).logits[0].float().log_softmax(-1)


def scored(llm, prompts, k=TOP, **options):
    params = SamplingParams(**{"temperature": 0.0, "max_tokens": 1, "prompt_logprobs": k,
                               **options})
    return llm.generate(prompts, params)


def assert_matches_hf(output, hf_model):
    ids = output.prompt_token_ids
    reference = hf_log_softmax(hf_model, ids)
    assert len(output.prompt_logprobs) == len(ids) and output.prompt_logprobs[0] is None
    for j, entry in enumerate(output.prompt_logprobs[1:]):
        token, row = ids[j + 1], reference[j]
        assert list(entry)[0] == token  # the prompt token first, then the top k
        assert entry[token].logprob == pytest.approx(row[token].item(), abs=1e-4)
        assert entry[token].rank == int((row > row[token]).sum()) + 1
        top = row.topk(TOP)
        alternatives = {t: lp for t, lp in entry.items() if lp.rank <= TOP}
        assert sorted(alternatives) == sorted(top.indices.tolist())
        for t, value in zip(top.indices.tolist(), top.values.tolist()):
            assert entry[t].logprob == pytest.approx(value, abs=1e-4)
        assert isinstance(entry[token], Logprob) and entry[token].decoded_token


def test_prompt_logprobs_equal_hf_through_chunked_prefill(llm, hf_model):
    outputs = scored(llm, PROMPTS)
    assert len(outputs[0].prompt_token_ids) > 8  # prefilled in chunks
    for output in outputs:
        assert_matches_hf(output, hf_model)


def test_a_cached_prefix_is_computed_again(llm, hf_model):
    prompt = PROMPTS[0] + " and jumping"
    llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1))  # now cached
    output = scored(llm, [prompt])[0]
    assert output.num_cached_tokens == 0
    assert_matches_hf(output, hf_model)
    again = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1))[0]
    assert again.num_cached_tokens > 0 and again.prompt_logprobs is None


def test_several_samples_share_one_prompt_scoring(llm):
    single = scored(llm, PROMPTS[1:])[0]
    several = scored(llm, PROMPTS[1:], n=2, temperature=1.0, seed=1)[0]
    assert len(several.outputs) == 2
    assert several.prompt_logprobs == single.prompt_logprobs


def test_a_one_token_prompt_and_k_zero(llm):
    one = scored(llm, [[42]])[0]
    assert one.prompt_logprobs == [None]
    zero = scored(llm, PROMPTS[1:], k=0)[0]
    assert all(len(entry) == 1 for entry in zero.prompt_logprobs[1:])


@pytest.mark.parametrize("value", [21, -1, 1.5])
def test_bad_values_are_errors(llm, value):
    with pytest.raises(ValueError, match="prompt_logprobs"):
        scored(llm, PROMPTS[1:], k=value)
    assert scored(llm, PROMPTS[1:], k=1)[0].prompt_logprobs is not None  # the engine goes on


def run_engine(engine, prompts, params) -> dict[str, list]:
    """Every output of each request, by request id, stepping the engine by hand."""
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    outputs: dict[str, list] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            outputs.setdefault(output.request_id, []).append(output)
    return outputs


TINY_PROMPTS = [list(range(1, 30)), [5], [7, 8, 9]]


def assert_close(got, want):
    """The same entries (another batch may round the last bits differently)."""
    assert len(got) == len(want) and got[0] is want[0] is None
    for got_entry, want_entry in zip(got[1:], want[1:]):
        assert list(got_entry) == list(want_entry)
        for token, lp in want_entry.items():
            assert got_entry[token].logprob == pytest.approx(lp.logprob, abs=1e-5)
            assert got_entry[token].rank == lp.rank


@pytest.fixture(scope="module")
def tiny_reference(tiny_llama_dir):
    """The inline output processor's outputs of TINY_PROMPTS."""
    llm = tiny_llm(tiny_llama_dir, max_num_batched_tokens=16)
    try:
        return llm.generate(TINY_PROMPTS, SamplingParams(temperature=0, max_tokens=3,
                                                         ignore_eos=True, prompt_logprobs=2))
    finally:
        llm.shutdown()


@pytest.mark.parametrize("mode", [dict(output_processor="process"),
                                  dict(engine_core_process=True),
                                  dict(output_processor="thread")],
                         ids=["output-process", "engine-core-process", "output-thread"])
def test_every_output_path_carries_them(tiny_llama_dir, tiny_reference, mode):
    """Cumulative outputs carry them in each output, delta ones once, through the output
    processor's process and thread and an engine core's process."""
    cumulative = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, prompt_logprobs=2)
    delta = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, prompt_logprobs=2,
                           output_kind="delta")
    want = tiny_reference
    llm = tiny_llm(tiny_llama_dir, max_num_batched_tokens=16, **mode)
    try:
        got = run_engine(llm.llm_engine, TINY_PROMPTS, cumulative)
        for i, expected in enumerate(want):
            for output in got[str(i)]:
                assert_close(output.prompt_logprobs, expected.prompt_logprobs)
        got = run_engine(llm.llm_engine, TINY_PROMPTS, delta)
        for i, expected in enumerate(want):
            carrying = [o.prompt_logprobs for o in got[str(i)] if o.prompt_logprobs]
            assert len(carrying) == 1
            assert_close(carrying[0], expected.prompt_logprobs)
    finally:
        llm.shutdown()
