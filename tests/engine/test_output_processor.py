"""The output processor on its own thread and in its own process, and the outputs made in
the caller's process of an engine core in another ("core"), give the outputs made inline
(on the engine loop): stop strings, n > 1, final-only requests, logprobs, streams, aborts; a request whose text cannot be made fails alone; no output is lost when a generate
call ends; a process that dies is a clear error."""
import dataclasses
import time

import pytest

from parashift import LLM, SamplingParams
from parashift.engine.detokenizer import IncrementalDetokenizer
from parashift.engine.request_outputs import RequestOutputs
from tests.engine.conftest import tiny_llm
from tests.helpers.tiny_smollm2 import save_tiny_smollm2

pytestmark = pytest.mark.usefixtures("single_torch_thread")

MODES = ("inline", "thread", "process", "core")
QUESTION = [{"role": "user", "content": "Tell me a short story about a cat."}]


def options(mode: str) -> dict:
    return {"engine_core_process": True} if mode == "core" else {"output_processor": mode}


@pytest.fixture(scope="module")
def llms_by_mode(tmp_path_factory):
    """An engine per mode on a tiny random Llama with SmolLM2's tokenizer: what is checked
    is how outputs are made from tokens, and its greedy story's tokens vary (a 135M model's
    40 steps in four engines, and their builds, took ~1 min of CI)."""
    model = save_tiny_smollm2(tmp_path_factory.mktemp("tiny_smollm2"))
    llms = {mode: LLM(model=model, device="cpu", dtype="float32", **options(mode))
            for mode in MODES}
    yield llms
    for llm in llms.values():
        llm.shutdown()


@pytest.fixture(scope="module")
def story(llms_by_mode):
    """The prompt and the greedy story's text after each of its tokens, the same in both
    modes (which now hold the prompt in their prefix caches alike)."""
    prompt = llms_by_mode["inline"].llm_engine.apply_chat_template(QUESTION)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    seen = same_in_both_modes(llms_by_mode, [("story", prompt, params)])["story"]
    return prompt, [output[4][0][1] for output in seen]


def fields(output):
    return (output.request_id, output.finished, output.error, output.num_cached_tokens,
            [(c.index, c.text, c.token_ids, c.logprobs, c.finish_reason, c.stop_reason)
             for c in output.outputs])


def stream(llm, requests) -> dict[str, list]:
    """Every output of each request, stepping the engine until all have finished."""
    engine = llm.llm_engine
    # in one hand-over: an engine core steps as soon as it holds a request
    assert engine.add_requests([(*request, 0) for request in requests]) == [None] * len(requests)
    seen = {request_id: [] for request_id, _, _ in requests}
    while engine.has_unfinished_requests():
        for output in engine.step():
            seen[output.request_id].append(fields(output))
    assert engine.step() == []  # what the processor still had gave no output
    return seen


def same_in_both_modes(llms, requests) -> dict[str, list]:
    """(in every mode) Every output of a one-sample request; a request of several samples
    folds its samples' outputs of one step into one, and which ones share a step depends on
    when an output processor off the loop answers: its last output."""
    inline, *others = (stream(llms[mode], requests) for mode in MODES)
    samples = {request_id: params.num_samples for request_id, _, params in requests}
    for mode, other in zip(MODES[1:], others):
        # (the core ends a stop string's request a step or two later: see assert_close)
        same = assert_close if mode == "core" else assert_same
        for request_id, outputs in inline.items():
            if samples[request_id] == 1:
                same(other[request_id], outputs)
            else:
                same(other[request_id][-1:], outputs[-1:])
    return inline


def assert_same(got: list, want: list) -> None:
    assert got == want


def assert_close(got: list, want: list) -> None:
    """The same outputs (fields of each), logprobs within 1e-4."""
    assert len(got) == len(want)
    for one, other in zip(got, want):
        assert one[:4] == other[:4] and len(one[4]) == len(other[4])
        for sample, wanted in zip(one[4], other[4]):
            assert sample[:3] + sample[4:] == wanted[:3] + wanted[4:]
            assert (sample[3] is None) == (wanted[3] is None)
            for got_lp, want_lp in zip(sample[3] or [], wanted[3] or []):
                assert got_lp.keys() == want_lp.keys()
                assert all(abs(got_lp[t] - want_lp[t]) < 1e-4 for t in got_lp)


def spanning_stop(texts: list[str]) -> tuple[str, int]:
    """A stop string made of the end of one token's text and the start of the next's,
    first found there; and the number of tokens that complete it."""
    for k in range(3, len(texts) - 1):
        before, after = texts[k - 1], texts[k]
        if len(after) - len(before) >= 2 and len(before) >= 2:
            stop = after[len(before) - 2:len(before) + 2]
            if stop.strip() and after.find(stop) == len(before) - 2:
                return stop, k + 1
    raise AssertionError("no token boundary to span")


def test_the_stories_steps_add_text(story):
    _, texts = story
    assert len(texts) == 40 and texts[-1].startswith(texts[10]) and len(texts[-1]) > 40


def test_a_stop_string_spanning_tokens_ends_the_request_there(llms_by_mode, story):
    prompt, texts = story
    stop, num_tokens = spanning_stop(texts)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop])
    seen = same_in_both_modes(llms_by_mode, [("s", prompt, params)])["s"]
    final = seen[-1][4][0]
    assert final[1] == texts[num_tokens - 1][:texts[num_tokens - 1].find(stop)]
    assert len(final[2]) == num_tokens and final[4:] == ("stop", stop)
    assert len(seen) == num_tokens  # no output for the tokens computed after the stop
    # a stream shows no part of the stop string: every output's text starts the final one
    assert all(final[1].startswith(output[4][0][1]) for output in seen)


def test_a_stop_string_on_the_last_allowed_token(llms_by_mode, story):
    """The token that reaches max_tokens completes the stop string: it is a stop."""
    prompt, texts = story
    stop, num_tokens = spanning_stop(texts)
    params = SamplingParams(temperature=0, max_tokens=num_tokens, ignore_eos=True,
                            stop=[stop], include_stop_str_in_output=True)
    final = same_in_both_modes(llms_by_mode, [("last", prompt, params)])["last"][-1][4][0]
    assert final[1].endswith(stop) and final[4:] == ("stop", stop)
    assert len(final[2]) == num_tokens


def test_stop_strings_n_logprobs_and_final_only_together(llms_by_mode, story):
    prompt, texts = story
    stop, _ = spanning_stop(texts)
    requests = [
        ("greedy", prompt, SamplingParams(temperature=0, max_tokens=30, stop=[stop, "cat"])),
        ("n3", prompt, SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=12,
                                      stop=[" the"], logprobs=1)),
        ("best", prompt, SamplingParams(n=2, best_of=3, temperature=1.0, seed=8,
                                        max_tokens=10)),
        ("final", prompt, SamplingParams(temperature=0.8, seed=3, max_tokens=16,
                                         logprobs=2).final_only()),
        ("n2-final", prompt, SamplingParams(n=2, temperature=0.8, seed=4, max_tokens=6)
         .final_only()),
    ]
    seen = same_in_both_modes(llms_by_mode, requests)
    assert len(seen["final"]) == 1 and seen["final"][0][1]
    assert [len(c[3]) for c in seen["final"][0][4]] == [len(seen["final"][0][4][0][2])]
    assert len(seen["n3"][-1][4]) == 3 and len(seen["best"][-1][4]) == 2
    assert all(output[1] for output in (seen[r][-1] for r in seen))


def joined(outputs: list) -> dict[int, tuple]:
    """Delta outputs' fields joined per sample: text, tokens, logprobs, finish."""
    samples = {}
    for output in outputs:
        for index, text, token_ids, logprobs, reason, stop_reason in output[4]:
            was = samples.get(index, ("", [], None, None, None))
            logprobs = None if logprobs is None else (was[2] or []) + logprobs
            samples[index] = (was[0] + text, was[1] + token_ids, logprobs, reason, stop_reason)
    return samples


@pytest.mark.parametrize("mode", MODES)
def test_delta_outputs_join_into_the_cumulative_ones(llms_by_mode, story, mode):
    """Each delta output carries what is new; joined, a request's deltas are its cumulative
    final output, sample by sample (stop string, logprobs, n=3, best_of). Both kinds run in
    one batch (logprobs within 1e-4: n > 1 admits siblings by timing outside inline mode)."""
    prompt, texts = story
    stop, _ = spanning_stop(texts)
    cases = {"stop": SamplingParams(temperature=0, max_tokens=30, stop=[stop], logprobs=1),
             "n3": SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=12, logprobs=0),
             "best": SamplingParams(n=2, best_of=3, temperature=1.0, seed=6, max_tokens=6)}
    seen = stream(llms_by_mode[mode], [
        (f"{kind}-{name}", prompt, dataclasses.replace(params, output_kind=kind))
        for name, params in cases.items() for kind in ("cumulative", "delta")])
    for name in cases:
        final = {c[0]: c[1:] for c in seen[f"cumulative-{name}"][-1][4]}
        deltas = joined(seen[f"delta-{name}"])
        assert deltas.keys() == final.keys()
        for index, (text, token_ids, logprobs, reason, stop_reason) in deltas.items():
            assert (text, token_ids, reason, stop_reason) == (
                final[index][0], final[index][1], final[index][3], final[index][4])
            assert (logprobs is None) == (final[index][2] is None)
            for got, want in zip(logprobs or [], final[index][2] or []):
                assert got.keys() == want.keys()
                assert all(abs(got[t] - want[t]) < 1e-4 for t in got)
    steps = seen["delta-stop"]
    assert len(steps) == len(seen["cumulative-stop"]) > 3
    assert all(len(output[4][0][2]) == 1 for output in steps)  # one new token a step
    # each output holds the samples that moved since the last, each with its new tokens
    assert all(c[2] for output in seen["delta-n3"] for c in output[4])


def test_generate_gives_the_same_outputs_in_both_modes(llms_by_mode, story):
    prompt, texts = story
    stop, _ = spanning_stop(texts)
    params = [SamplingParams(temperature=0, max_tokens=24, stop=[stop]),
              SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=8, logprobs=0),
              SamplingParams(temperature=0, max_tokens=3, logprobs=1)]
    outputs = {mode: [fields(o) for o in llm.generate([prompt] * 3, params)]
               for mode, llm in llms_by_mode.items()}
    # an output processor off the loop (thread, process, core) may end a stop string's
    # request a step or two later, as its answer comes: the batches of the other requests
    # then differ, and their logprobs in the last bits (CI saw it in thread mode)
    for mode in MODES[1:]:
        assert_close(outputs[mode], outputs["inline"])


@pytest.mark.parametrize("mode", ("inline", "thread"))
def test_a_request_whose_detokenizer_raises_fails_alone(llms_by_mode, monkeypatch, mode):
    real = IncrementalDetokenizer.take_texts

    def take_texts(self, prefix_text, full_text):
        if self.params.seed == 13 and len(self.token_ids) > 8:
            raise ValueError("boom")
        return real(self, prefix_text, full_text)

    monkeypatch.setattr(IncrementalDetokenizer, "take_texts", take_texts)
    llm = llms_by_mode[mode]
    good = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    bad = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, seed=13)
    outs = llm.generate(["Hello", "Hello", "Hello"], [good, bad, good])
    assert outs[1].finished and outs[1].outputs[0].finish_reason == "error"
    assert "boom" in outs[1].error
    assert [len(o.outputs[0].token_ids) for o in (outs[0], outs[2])] == [8, 8]
    assert outs[0].outputs[0].text == outs[2].outputs[0].text != ""
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


@pytest.fixture
def slow_processor(monkeypatch):
    """Every step's outputs take 20 ms to make: the engine runs ahead of them."""
    real = RequestOutputs._take_step

    def take_step(self, step):
        time.sleep(0.02)
        return real(self, step)

    monkeypatch.setattr(RequestOutputs, "_take_step", take_step)


def test_generate_returns_every_final_output_of_a_slow_processor(tiny_llama_dir,
                                                                 slow_processor):
    llm = tiny_llm(tiny_llama_dir)
    params = [SamplingParams(temperature=0, max_tokens=1 + i % 7, ignore_eos=True)
              for i in range(12)]
    outs = llm.generate([[1 + i, 2, 3] for i in range(12)], params)
    assert [len(o.outputs[0].token_ids) for o in outs] == [p.max_tokens for p in params]
    assert all(o.finished and o.outputs[0].finish_reason == "length" for o in outs)
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests() and engine.step() == []


def test_a_slow_processors_stop_string_ends_the_request_later_with_the_same_output(
        llms_by_mode, story, slow_processor):
    """The engine computes tokens past the stop string before it hears of it; none of
    them is reported, and the request's blocks are freed."""
    prompt, texts = story
    stop, num_tokens = spanning_stop(texts)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop])
    seen = same_in_both_modes(llms_by_mode, [("slow", prompt, params)])["slow"]
    assert len(seen) == num_tokens and seen[-1][4][0][4:] == ("stop", stop)
    engine = llms_by_mode["thread"].llm_engine
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_an_aborted_request_reports_nothing_more(tiny_llama_dir, slow_processor):
    engine = tiny_llm(tiny_llama_dir).llm_engine
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    engine.add_request("gone", [1, 2, 3], params)
    engine.add_request("kept", [4, 5, 6], params)
    for _ in range(4):
        engine.step()
    engine.abort_request("gone")
    engine.add_request("gone", [7, 8, 9], SamplingParams(temperature=0, max_tokens=2,
                                                         ignore_eos=True))
    seen = []
    while engine.has_unfinished_requests():
        seen += [(o.request_id, len(o.outputs[0].token_ids)) for o in engine.step()]
    assert [n for r, n in seen if r == "gone"] == [1, 2]
    assert ("kept", 20) in seen


def test_output_processor_is_checked():
    from parashift.config import EngineConfig
    with pytest.raises(ValueError, match="output_processor"):
        EngineConfig(output_processor="processes")


@pytest.mark.parametrize("tokenizer, device, cores, mode", [
    (object(), "cuda", 16, "process"), (None, "cuda", 16, "inline"),
    (object(), "cpu", 16, "inline"), (object(), "cuda", 2, "inline")])
def test_auto_mode_takes_a_process_on_gpu_hosts_with_texts_to_make(tokenizer, device, cores,
                                                                   mode):
    from parashift.engine.output_processor import auto_mode
    assert auto_mode(tokenizer, device, cores) == mode


def test_auto_is_inline_on_the_cpu(smollm2):
    from parashift.engine.output_processor import OutputProcessor
    assert smollm2.llm_engine.config.output_processor == "auto"
    processor = smollm2.llm_engine.output_processor
    assert type(processor) is OutputProcessor and processor._thread is None
