"""The CPU GEMM route chosen per (weight shape, row bucket) at start-up
(parashift/layers/cpu_gemm_choice.py): the fastest of the timed routes, recorded with its
timings, forced by PARASHIFT_CPU_GEMM, every route giving the plain GEMM's products and an
engine's greedy tokens unchanged whichever route it takes."""
import pytest
import torch
import torch.nn.functional as F

from parashift import SamplingParams
from parashift.layers import cpu_gemm_choice, cpu_gemm_sweep, cpu_packed
from parashift.layers.cpu_gemm_choice import (ENV, ROW_BUCKETS, bucket_of, choose_routes,
                                              mkl_packs, onednn_packs)
from parashift.layers.cpu_packed import PackedLinear, unpack_cpu_weights
from tests.engine.conftest import save_tiny_llama, tiny_llm

pytestmark = [pytest.mark.usefixtures("single_torch_thread"),
              pytest.mark.skipif(not cpu_packed.can_pack(), reason="torch built without oneDNN")]
needs_mkl = pytest.mark.skipif(not mkl_packs(), reason="torch built without MKL")


def test_rows_fall_in_buckets():
    assert [bucket_of(r) for r in (1, 2, 16, 64, 65, 512)] == [1, 16, 16, 16, 256, 256]


def test_the_fastest_route_is_kept_and_an_untimed_bucket_takes_the_largest_below():
    assert cpu_gemm_choice.DEFAULT_ROUTE == "onednn"
    timings = {1: {"plain": 0.2, "onednn": 0.3, "mkl": 0.1}, 16: {"plain": 0.4, "onednn": 0.5}}
    assert cpu_gemm_choice._decide(timings, {}) == {1: "mkl", 16: "plain", 256: "plain"}
    one_row_only = {1: {"plain": 0.2, "onednn": 0.3, "mkl": 0.1}}  # 16 and 256 untimed
    assert cpu_gemm_choice._decide(one_row_only, {}) == {1: "mkl", 16: "onednn", 256: "onednn"}
    hinted = {16: {"onednn": 0.3, "onednn16": 0.2}}  # packed for 16 rows: not for 256
    assert cpu_gemm_choice._decide(hinted, {})[256] == "onednn"
    lost = {1: {"mkl": 0.3, "onednn": 0.2}}  # mkl's rematch against the default
    assert cpu_gemm_choice._decide(timings, lost) == {1: "onednn", 16: "plain", 256: "plain"}


def test_timed_routes_are_recorded_per_shape_and_bucket(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(96, 48, generator=gen) for _ in range(3)] + \
        [torch.randn(40, 48, generator=gen).bfloat16()]
    choice = choose_routes(weights)
    assert choice.swept == (1, 16)  # tiny weights: every route's copies fit
    assert choice.source == "timed" and set(choice.routes) == {(96, 48, torch.float32),
                                                                (40, 48, torch.bfloat16)}
    if not onednn_packs(torch.bfloat16):  # an AVX2-only CPU: bf16 stays plain, untimed
        assert choice.routes.pop((40, 48, torch.bfloat16)) == dict.fromkeys(ROW_BUCKETS, "plain")
        assert (40, 48, torch.bfloat16) not in choice.timings
    for shape, by_bucket in choice.routes.items():
        timed = choice.timings[shape]
        assert set(by_bucket) == set(ROW_BUCKETS) == set(timed)
        for bucket, route in by_bucket.items():
            expected = {"plain", "onednn", f"onednn{bucket}"} | (
                {"mkl"} if bucket == 1 and shape[2] == torch.float32 and mkl_packs() else set())
            assert set(timed[bucket]) == expected - ({"onednn1"} if bucket in choice.swept
                                                     else set())
            winner = min(timed[bucket], key=timed[bucket].get)
            rematch = choice.rematches[shape].get(bucket)
            swept = bucket in choice.swept  # the sweeps' timings are their own rematch
            assert (rematch is not None) == (winner != "onednn" and not swept)
            against = timed[bucket] if swept else rematch
            kept = winner == "onednn" or against[winner] < against["onednn"] * (
                1 - cpu_gemm_choice.REMATCH_MARGIN)
            assert route == (winner if kept else "onednn")
    rows = choice.as_dict()["routes"]
    assert len(rows) == len(choice.routes) * len(ROW_BUCKETS)
    assert all(r["ms"] is not None for r in rows)
    assert "96x48 float32" in choice.describe()


def test_few_rows_are_timed_in_sweeps_of_every_weight_in_the_model_order(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    calls = []

    def run_route(route, x, packed, weight, bias):
        calls.append((route, x.shape[0], weight.shape[0]))
    monkeypatch.setattr(cpu_gemm_choice, "run_route", run_route)
    monkeypatch.setattr(cpu_gemm_sweep, "SWEEPS", 1)  # the warm-up + one sweep
    weights = [torch.randn(out, 8) for _ in range(2) for out in (16, 24)]
    choice = choose_routes(weights)
    assert choice.swept == (1, 16)
    calls = [c for c in calls if c[1] < 256]  # the 256-row bucket: raced
    sweeps = [calls[i:i + 4] for i in range(0, len(calls), 4)]
    assert all([c[2] for c in sweep] == [16, 24, 16, 24] and len({c[:2] for c in sweep}) == 1
               for sweep in sweeps)  # each sweep: one route, one row count, model order
    routes_at_1 = {"plain", "onednn"} | ({"mkl"} if mkl_packs() else set())  # not onednn1
    assert sorted(c[:2] for c in calls[::4]) == sorted(
        [(r, 1) for r in routes_at_1] * 2 + [(r, 16) for r in ("plain", "onednn", "onednn16")] * 2)
    assert set(choice.timings[16, 8, torch.float32]) == set(ROW_BUCKETS)


def test_weights_whose_copies_do_not_fit_are_raced_a_few_at_a_time(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(cpu_gemm_choice, "sweep_fits", lambda weights, copies: False)
    choice = choose_routes([torch.randn(16, 8)])
    assert choice.swept == () and set(choice.rematches[16, 8, torch.float32]) <= {1, 16, 256}
    assert set(choice.timings[16, 8, torch.float32]) == set(ROW_BUCKETS)


def test_a_route_beating_the_default_once_must_beat_it_again(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(cpu_gemm_choice, "sweep_fits", lambda weights, copies: False)
    races = []

    def race(runs):  # plain wins the first race of each bucket by noise, loses the second
        races.append(sorted(runs))
        first = len(races) % 2 == 1
        return {r: (0.1 if r == "plain" and first else 0.3 if r == "plain" else 0.2)
                for r in runs}
    monkeypatch.setattr(cpu_gemm_choice, "_race", race)
    choice = choose_routes([torch.randn(16, 8)])
    assert races[1] == ["onednn", "plain"]  # the rematch: the winner against the default
    assert choice.routes[16, 8, torch.float32] == dict.fromkeys(ROW_BUCKETS, "onednn")
    assert choice.timings[16, 8, torch.float32][1]["plain"] == 0.1
    assert choice.rematches[16, 8, torch.float32][1] == {"plain": 0.3, "onednn": 0.2}


def test_timing_past_its_budget_leaves_the_rest_on_the_default(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(cpu_gemm_choice, "TOTAL_BUDGET_S", 0.0)
    monkeypatch.setattr(cpu_gemm_choice, "sweep_fits", lambda weights, copies: False)  # races
    choice = choose_routes([torch.randn(16, 8), torch.randn(24, 8)])
    assert choice.timings == {(16, 8, torch.float32): {}, (24, 8, torch.float32): {}}
    assert "6 buckets untimed" in choice.source
    assert all(r == dict.fromkeys(ROW_BUCKETS, "onednn") for r in choice.routes.values())


def test_routes_needing_more_copies_than_fit_fall_back_to_one(monkeypatch):
    monkeypatch.setenv(ENV, "onednn1")  # two oneDNN copies a weight
    layer = torch.nn.Linear(64, 64)
    layer.matmul = F.linear
    monkeypatch.setattr(cpu_packed, "mem_available_bytes", lambda: 3 * layer.weight.nbytes)
    choice = cpu_packed.pack_cpu_weights(layer)
    assert "onednn alone" in choice.source and layer.matmul.routes == dict.fromkeys(
        ROW_BUCKETS, "onednn") and choice.nbytes == layer.weight.nbytes


@pytest.mark.parametrize("forced", ["plain", "onednn", "onednn1", "onednn16",
                                    pytest.param("mkl", marks=needs_mkl)])
def test_a_route_is_forced_by_env(monkeypatch, forced):
    monkeypatch.setenv(ENV, forced)
    choice = choose_routes([torch.randn(32, 16), torch.randn(32, 16).bfloat16()])
    assert choice.source == f"{ENV}={forced}" and choice.timings == {}
    fp32, bf16 = choice.routes[32, 16, torch.float32], choice.routes[32, 16, torch.bfloat16]
    if not onednn_packs(torch.bfloat16):  # an AVX2-only CPU: bf16 stays plain
        assert set(bf16.values()) == {"plain"}
        bf16 = fp32 if forced != "mkl" else dict.fromkeys(ROW_BUCKETS, "plain")
    if forced == "mkl":  # one-row fp32 steps only
        assert fp32 == {1: "mkl", 16: "plain", 256: "plain"}
        assert set(bf16.values()) == {"plain"} and choice.mkl_bytes[32, 16, torch.float32] > 0
    elif forced == "onednn1":  # one-row steps
        assert fp32 == bf16 == {1: "onednn1", 16: "onednn", 256: "onednn"}
    elif forced == "onednn16":
        assert fp32 == bf16 == {1: "onednn", 16: "onednn16", 256: "onednn"}
    else:
        assert set(fp32.values()) == set(bf16.values()) == {forced}


def test_a_dtype_onednn_cannot_pack_here_stays_plain(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(cpu_gemm_choice, "onednn_packs", lambda dtype: dtype != torch.bfloat16)
    choice = choose_routes([torch.randn(32, 16).bfloat16(), torch.randn(24, 16)])
    assert choice.routes[32, 16, torch.bfloat16] == dict.fromkeys(ROW_BUCKETS, "plain")
    assert (32, 16, torch.bfloat16) not in choice.timings
    assert (24, 16, torch.float32) in choice.timings


def test_an_unknown_route_is_refused(monkeypatch):
    monkeypatch.setenv(ENV, "fastest")
    with pytest.raises(ValueError, match=f"{ENV}='fastest'"):
        choose_routes([torch.randn(8, 8)])


@pytest.mark.parametrize("routes", [{1: "plain", 16: "onednn", 256: "plain"},
                                    {1: "onednn1", 16: "onednn16", 256: "onednn256"},
                                    pytest.param({1: "mkl", 16: "plain", 256: "onednn"},
                                                 marks=needs_mkl)])
@pytest.mark.parametrize("rows", [1, 5, 70])
def test_every_route_gives_the_plain_products(routes, rows):
    gen = torch.Generator().manual_seed(rows)
    weight, bias = torch.randn(96, 48, generator=gen), torch.randn(96, generator=gen)
    x = torch.randn(rows, 48, generator=gen)
    plain_calls = []

    def fallback(x, w, b):
        plain_calls.append(rows)
        return F.linear(x, w, b)
    packed = PackedLinear(weight, fallback, routes)
    for b in (None, bias):
        torch.testing.assert_close(packed(x, weight, b), F.linear(x, weight, b),
                                   atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(packed(x[None], weight, b)[0], F.linear(x, weight, b),
                                   atol=1e-4, rtol=1e-4)
    assert len(plain_calls) == (4 if routes[bucket_of(rows)] == "plain" else 0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama_routes"))


PROMPTS = [[5, 17, 300, 42, 7], [9, 8, 7, 6, 5, 4, 3, 2, 1, 11, 12], [3]]
PARAMS = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


def greedy(llm) -> list[list[int]]:
    """A batch (steps of several rows), then one prompt alone (one-row decode steps)."""
    batch = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]
    alone = llm.generate([PROMPTS[1]], PARAMS, use_tqdm=False)[0].outputs[0].token_ids
    return [*batch, alone]


@pytest.fixture(scope="module")
def reference_tokens(model_dir):
    llm = tiny_llm(model_dir, enable_prefix_caching=False)
    unpack_cpu_weights(llm.llm_engine.runner.model)
    return greedy(llm)


@pytest.mark.parametrize("forced", [None, "plain", "onednn", "onednn1", "onednn16",
                                    pytest.param("mkl", marks=needs_mkl)])
def test_an_engine_records_its_routes_and_keeps_its_tokens(model_dir, reference_tokens,
                                                           monkeypatch, forced):
    if forced is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, forced)
    llm = tiny_llm(model_dir, enable_prefix_caching=False)
    choice = llm.llm_engine.runner.cpu_gemm
    assert choice.source == ("timed" if forced is None else f"{ENV}={forced}")
    # qkv, o, gate_up, down and the LM head: five shapes
    assert len(choice.routes) == 5 and len(choice.timings) == (5 if forced is None else 0)
    model = llm.llm_engine.runner.model
    taken = [m.matmul.routes for m in model.modules()
             if isinstance(getattr(m, "matmul", None), PackedLinear)]
    # timed, every route may come out plain (an AVX2 CPU's oneDNN at these tiny weights)
    packs = any(r != "plain" for by_bucket in choice.routes.values() for r in by_bucket.values())
    assert packs == (forced != "plain") or forced is None
    if packs:
        assert taken and choice.nbytes > 0
    else:
        assert taken == [] and choice.nbytes == 0
    used = set()
    run_route = cpu_packed.run_route

    def spy(route, *args):
        used.add(route)
        return run_route(route, *args)
    monkeypatch.setattr(cpu_packed, "run_route", spy)
    assert greedy(llm) == reference_tokens
    if forced not in (None, "plain"):
        assert forced in used  # the one-row routes too: the lone prompt's decode steps
