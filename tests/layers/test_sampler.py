import math

import pytest
import torch

from parashift.layers.penalties import PADDING_TOKEN, TokenHistory, apply_logits_processors
from parashift.layers.sampler import Sampler
from parashift.sampling_params import SamplingParams

VOCAB = 50


def sample(logits, params, generators=None, seed=0):
    generators = generators or [None] * len(params)
    return Sampler("cpu", seed=seed)(logits, params, generators)


def distinct_logits(rows: int, vocab: int = VOCAB, seed: int = 0) -> torch.Tensor:
    """Logits without ties, spread so that every token has a fair chance."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(vocab, generator=g).float() / vocab * 3 for _ in range(rows)])


def repeat_row(logits_row: list[float], rows: int) -> torch.Tensor:
    return torch.tensor([logits_row], dtype=torch.float32).repeat(rows, 1)


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_greedy_is_argmax():
    logits = torch.randn(8, VOCAB)
    out = sample(logits, [SamplingParams(temperature=0)] * 8)
    assert out.token_ids.dtype == torch.int64
    assert torch.equal(out.token_ids, logits.argmax(-1))
    assert out.logprobs is None


def test_argmax_gives_what_the_sampler_gives_argmax_only_rows():
    """The model runner's shortcut for steps whose rows are all argmax_only (bf16 logits
    too, with ties: both take the first maximum of the same float32 values)."""
    params = [SamplingParams(temperature=0), SamplingParams(top_k=1, seed=5)] * 4
    assert all(p.argmax_only for p in params)
    for logits in (torch.randn(8, VOCAB), torch.randn(8, VOCAB).bfloat16(),
                   torch.zeros(8, VOCAB)):
        full, short = sample(logits, params), Sampler.argmax(logits)
        assert torch.equal(short.token_ids, full.token_ids) and short.logprobs is None
        assert short.token_ids.dtype == torch.int64


def test_tiny_temperature_is_greedy_not_nan():
    logits = torch.randn(4, VOCAB) * 10
    out = sample(logits, [SamplingParams(temperature=1e-30)] * 4)
    assert torch.equal(out.token_ids, logits.argmax(-1))


def test_temperature_to_zero_approaches_argmax():
    logits = distinct_logits(64)  # neighbouring logits differ by >= 0.06
    for seed in range(5):
        out = sample(logits, [SamplingParams(temperature=1e-3)] * 64, seed=seed)
        assert torch.equal(out.token_ids, logits.argmax(-1))


def test_top_k_one_equals_greedy():
    logits = distinct_logits(32)
    params = [SamplingParams(temperature=1.5, top_k=1, seed=i) for i in range(32)]
    generators = [Sampler.make_generator(i, "cpu") for i in range(32)]
    out = sample(logits, params, generators)
    assert torch.equal(out.token_ids, logits.argmax(-1))


def test_mixed_greedy_and_random_rows():
    logits = distinct_logits(6)
    params = [SamplingParams(temperature=0), SamplingParams(), SamplingParams(top_k=1),
              SamplingParams(top_p=0.5), SamplingParams(temperature=0, logprobs=1), SamplingParams()]
    out = sample(logits, params)
    greedy_rows = [0, 2, 4]
    assert torch.equal(out.token_ids[greedy_rows], logits.argmax(-1)[greedy_rows])


@pytest.mark.parametrize("k", [2, 5, 17])
def test_top_k_stays_in_allowed_set(k):
    logits = repeat_row(distinct_logits(1)[0].tolist(), 2000)
    allowed = set(logits[0].topk(k).indices.tolist())
    seen = set(sample(logits, [SamplingParams(top_k=k)] * 2000).token_ids.tolist())
    assert seen == allowed  # never outside, and every allowed token shows up


# probabilities 0.4, 0.3, 0.15, 0.1, 0.05, placed at shuffled vocabulary positions
PROBS = {7: 0.4, 2: 0.3, 9: 0.15, 0: 0.1, 4: 0.05}


def known_logits(rows: int) -> torch.Tensor:
    row = [-math.inf] * 10
    for token, p in PROBS.items():
        row[token] = math.log(p)
    return repeat_row(row, rows)


@pytest.mark.parametrize("top_p,allowed", [(0.3, {7}), (0.6, {7, 2}), (0.8, {7, 2, 9}),
                                           (0.9, {7, 2, 9, 0}), (1.0, {7, 2, 9, 0, 4})])
def test_top_p_stays_in_allowed_set(top_p, allowed):
    seen = set(sample(known_logits(3000), [SamplingParams(top_p=top_p)] * 3000).token_ids.tolist())
    assert seen == allowed


@pytest.mark.parametrize("min_p,allowed", [(0.9, {7}), (0.5, {7, 2}), (0.3, {7, 2, 9}),
                                           (0.2, {7, 2, 9, 0}), (0.0, {7, 2, 9, 0, 4})])
def test_min_p_stays_in_allowed_set(min_p, allowed):
    seen = set(sample(known_logits(3000), [SamplingParams(min_p=min_p)] * 3000).token_ids.tolist())
    assert seen == allowed


def test_filters_combine_and_apply_per_row():
    rows = 3000
    params = ([SamplingParams(top_k=3, top_p=0.6)] * rows + [SamplingParams(min_p=0.3, top_k=2)] * rows
              + [SamplingParams(top_p=0.8, min_p=0.5)] * rows + [SamplingParams()] * rows)
    out = sample(known_logits(4 * rows), params).token_ids.view(4, rows)
    assert set(out[0].tolist()) == {7, 2}
    assert set(out[1].tolist()) == {7, 2}
    assert set(out[2].tolist()) == {7, 2}
    assert set(out[3].tolist()) == set(PROBS)  # the unfiltered row is not affected by the others


def seeded_tokens(position: int, others: list[SamplingParams], steps: int = 5) -> list[int]:
    """Tokens of a seeded request sampled at `position` among `others`, over `steps` steps."""
    sampler = Sampler("cpu", seed=len(others))  # the engine seed must not matter either
    generator = Sampler.make_generator(1234, "cpu")
    params = list(others)
    params.insert(position, SamplingParams(temperature=0.9, top_p=0.95, seed=1234))
    generators: list = [None] * len(others)
    generators.insert(position, generator)
    tokens = []
    for step in range(steps):
        logits = distinct_logits(len(params), seed=step)
        logits[position] = distinct_logits(1, seed=100 + step)[0]
        tokens.append(sampler(logits, params, generators).token_ids[position].item())
    return tokens


def test_seeded_row_reproducible_across_batches_and_positions():
    alone = seeded_tokens(0, [])
    assert seeded_tokens(0, []) == alone
    assert seeded_tokens(2, [SamplingParams(), SamplingParams(top_k=3), SamplingParams(seed=7)]) == alone
    assert seeded_tokens(1, [SamplingParams(temperature=0), SamplingParams(min_p=0.2)]) == alone
    assert seeded_tokens(0, [SamplingParams(logprobs=2)] * 5) == alone


def test_seeded_rows_with_different_seeds_differ():
    def draw(seeds):
        params = [SamplingParams(seed=s) for s in seeds]
        generators = [Sampler.make_generator(s, "cpu") for s in seeds]
        return sample(repeat_row([0.0] * VOCAB, len(seeds)), params, generators).token_ids.tolist()

    alone = [draw([s])[0] for s in range(20)]
    assert len(set(alone)) > 5
    assert draw([1, 2]) == [alone[1], alone[2]]


def test_unseeded_rows_reproducible_for_a_fixed_engine_seed():
    logits = distinct_logits(16)
    params = [SamplingParams()] * 16
    first = [sample(logits, params, seed=3).token_ids for _ in range(2)]
    assert torch.equal(first[0], first[1])
    assert not torch.equal(first[0], sample(logits, params, seed=4).token_ids)


def test_distribution_matches_tempered_and_filtered_probs():
    # chi-square critical value for 3 degrees of freedom at p = 1e-4 is 21.1; seeds are fixed
    base = torch.tensor([0.1, 0.2, 0.3, 0.4])
    cases = [(SamplingParams(), base),
             (SamplingParams(temperature=2.0), base.sqrt() / base.sqrt().sum()),
             (SamplingParams(temperature=0.5), base ** 2 / (base ** 2).sum()),
             (SamplingParams(top_k=3), torch.tensor([0, 2, 3, 4]) / 9)]
    rows = 20000
    for params, probs in cases:
        logits = repeat_row(base.log().tolist(), rows)
        counts = torch.bincount(sample(logits, [params] * rows).token_ids, minlength=4).float()
        nonzero = probs > 0
        assert counts[~nonzero].sum() == 0
        assert chi_square(counts[nonzero], probs[nonzero]) < 21.1, (params, counts)


def test_seeded_rows_distribution():
    base = torch.tensor([0.1, 0.2, 0.3, 0.4])
    rows = 8000
    generators = [Sampler.make_generator(seed, "cpu") for seed in range(rows)]
    params = [SamplingParams(seed=seed) for seed in range(rows)]
    tokens = sample(repeat_row(base.log().tolist(), rows), params, generators).token_ids
    assert chi_square(torch.bincount(tokens, minlength=4).float(), base) < 21.1


def test_logprobs_are_raw_log_softmax_with_top_k_and_sampled_token():
    logits = distinct_logits(4)
    params = [SamplingParams(temperature=0.7, logprobs=3), SamplingParams(),
              SamplingParams(temperature=0, logprobs=0), SamplingParams(top_k=2, logprobs=5)]
    out = sample(logits, params)
    expected = logits.log_softmax(-1)
    assert out.logprobs[1] is None
    for row in (0, 2, 3):
        entry = out.logprobs[row]
        token = out.token_ids[row].item()
        top = expected[row].topk(params[row].logprobs).indices.tolist()
        assert set(entry) == set(top) | {token}
        assert next(iter(entry)) == token  # the sampled token comes first
        for t, lp in entry.items():
            assert lp == pytest.approx(expected[row, t].item(), abs=1e-5)


def test_logprobs_contain_sampled_token_outside_top_k():
    logits = repeat_row([0.0, 0.1, 0.2, 5.0], 200)
    out = sample(logits, [SamplingParams(temperature=100.0, logprobs=1)] * 200)
    outside = [row for row in range(200) if out.token_ids[row] != 3]
    assert outside
    for row in outside:
        assert set(out.logprobs[row]) == {out.token_ids[row].item(), 3}


# ---- logit bias and penalties, against a plain per-token reference --------------------
def reference_processed(logits: torch.Tensor, params: list[SamplingParams],
                        prompts: list[list[int]], outputs: list[list[int]]) -> torch.Tensor:
    """Logit bias, then repetition, frequency and presence penalties, token by token."""
    out = logits.clone()
    for row, p in enumerate(params):
        for token, bias in (p.logit_bias or {}).items():
            out[row, token] += bias
        seen = set(prompts[row]) | set(outputs[row])
        for token in range(out.shape[1]):
            value = float(out[row, token])
            if token in seen and p.repetition_penalty != 1.0:
                value = value / p.repetition_penalty if value > 0 else \
                    value * p.repetition_penalty
            count = outputs[row].count(token)
            value -= p.frequency_penalty * count + p.presence_penalty * (count > 0)
            out[row, token] = value
    return out


def history_of(rows: list[int], prompts, outputs) -> TokenHistory:
    width = max(len(prompts[r]) + len(outputs[r]) for r in rows)
    tokens = torch.full((len(rows), width), PADDING_TOKEN, dtype=torch.int64)
    is_output = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        seq = prompts[r] + outputs[r]
        tokens[i, :len(seq)] = torch.tensor(seq)
        is_output[i, len(prompts[r]):len(seq)] = True
    return TokenHistory(rows, tokens, is_output)


def test_penalties_and_logit_bias_match_the_reference():
    rng = torch.Generator().manual_seed(3)
    params = [SamplingParams(repetition_penalty=1.7),
              SamplingParams(),  # no option: untouched
              SamplingParams(frequency_penalty=0.9, presence_penalty=-0.4,
                             logit_bias={3: 5.0, 7: -100.0}),
              SamplingParams(presence_penalty=2.0, repetition_penalty=0.5,
                             frequency_penalty=-2.0),
              SamplingParams(logit_bias={0: 1.5})]
    prompts = [torch.randint(0, VOCAB, (n,), generator=rng).tolist() for n in (9, 4, 1, 20, 3)]
    outputs = [torch.randint(0, 10, (n,), generator=rng).tolist() for n in (5, 0, 12, 7, 2)]
    logits = torch.randn(len(params), VOCAB, generator=rng) * 3
    history = history_of([r for r, p in enumerate(params) if p.uses_history], prompts, outputs)
    got = apply_logits_processors(logits, params, history)
    want = reference_processed(logits, params, prompts, outputs)
    torch.testing.assert_close(got, want)
    assert torch.equal(got[1], logits[1])
    greedy = [SamplingParams(**{**p.__dict__, "temperature": 0}) for p in params]
    out = Sampler("cpu")(logits, greedy, [None] * len(params), history=history)
    assert out.token_ids.tolist() == want.argmax(-1).tolist()


def test_greedy_rows_pick_the_penalized_argmax_and_logprobs_stay_raw():
    logits = torch.tensor([[4.0, 3.9, 0.0, -1.0], [2.0, 1.0, 0.5, 0.0]])
    params = [SamplingParams(temperature=0, repetition_penalty=2.0, logprobs=1),
              SamplingParams(temperature=0, frequency_penalty=2.0, logprobs=1)]
    history = history_of([0, 1], [[0], [2]], [[], [0, 0]])
    out = Sampler("cpu")(logits, params, [None, None], history=history)
    assert out.token_ids.tolist() == [1, 1]  # 4 / 2 < 3.9; 2 - 2 * 2 < 1
    raw = logits.log_softmax(-1)
    assert out.logprobs[0][1] == pytest.approx(float(raw[0, 1]))
    assert out.logprobs[1][1] == pytest.approx(float(raw[1, 1]))


def test_negative_logits_of_seen_tokens_are_multiplied():
    logits = torch.tensor([[-1.0, -1.5, -3.0]])
    history = history_of([0], [[0]], [[]])
    got = apply_logits_processors(logits, [SamplingParams(repetition_penalty=2.0)], history)
    assert got.tolist() == [[-2.0, -1.5, -3.0]]


def test_no_options_leave_the_logits_alone():
    logits = torch.randn(3, VOCAB)
    assert apply_logits_processors(logits, [SamplingParams()] * 3, None) is logits


def test_seeded_sampling_with_bias_only_draws_from_the_biased_token():
    logits = distinct_logits(4)
    params = [SamplingParams(temperature=1.0, seed=s, logit_bias={5: 100.0}) for s in range(4)]
    out = sample(logits, params, [Sampler.make_generator(s, "cpu") for s in range(4)])
    assert out.token_ids.tolist() == [5] * 4
