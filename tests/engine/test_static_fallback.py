"""The sidp and shift policies' start-up check with the cost model and the workload told:
the policy runs where the model puts it ahead of every static plan of its GPUs, else the
best static plan runs under the static policy (8B shape, committed H200 profiles)."""
import json
import runpy
from types import SimpleNamespace

import pytest

from parashift.config import EngineConfig
from parashift.cost.shape import SHAPES
from parashift.engine.static_fallback import design_choice, resolve_static_fallback

PROFILE = str(SHAPES.parent / "results" / "profiles" / "h200_compute.json")
LLAMA_8B = SimpleNamespace(**json.loads((SHAPES / "llama-3.1-8b.json").read_text()))


def sidp(**options) -> EngineConfig:
    return EngineConfig(parallel_policy="sidp", data_parallel_size=4, cost_profile=PROFILE,
                        max_num_batched_tokens=8192, **options)


def test_a_light_online_load_falls_back_to_tp(caplog):
    config = resolve_static_fallback(sidp(sidp_mean_prompt_tokens=1024, sidp_request_rate=4.0),
                                   LLAMA_8B)
    assert config.parallel_policy == "static" and not config.sidp.share_ffn
    assert config.node_layout.name() == "tp4" and config.sidp.request_rate is None
    assert "the static plan tp4 is predicted to serve this workload better" in caplog.text


def test_where_sidp_is_predicted_ahead_it_runs():
    """Its CaS decodes replay graphs (by default, as with --cuda-graphs); with
    --no-cuda-graphs its eager CaS rounds (each layer's exchanges launched from every peer's
    host) lose to DP2xTP2."""
    hint = dict(sidp_mean_prompt_tokens=1024, sidp_mean_output_tokens=64, sidp_num_requests=64)
    eager = resolve_static_fallback(sidp(**hint, cuda_graphs=False), LLAMA_8B)
    assert eager.node_layout.name() == "tp2,tp2@2-3"
    for graphs in (None, True):
        told = sidp(**hint, cuda_graphs=graphs)
        assert resolve_static_fallback(told, LLAMA_8B) is told
        choice = design_choice(told, LLAMA_8B)
        assert choice.best.name == "sidp-dp4" and not choice.static
        assert choice.best.detail["b_th"] == 4666  # the model's crossover at d = 4


def test_untold_it_is_left_alone_and_the_hints_need_the_cost_model():
    plain = sidp()
    assert resolve_static_fallback(plain, LLAMA_8B) is plain
    with pytest.raises(ValueError, match="sidp_request_rate is an option of the sidp policy "
                                         "with cost_profile"):
        EngineConfig(parallel_policy="sidp", data_parallel_size=2, sidp_request_rate=2.0)
    with pytest.raises(ValueError, match="sidp_num_requests must be an integer >= 1"):
        sidp(sidp_num_requests=0)
    with pytest.raises(ValueError, match="sidp_request_rate must be a number > 0"):
        sidp(sidp_request_rate=-1.0)


def test_a_workload_file_shows_the_tail_that_means_hide(tmp_path):
    """255 requests of 500 + 100 tokens and one of 500 + 8000: the means (131 output tokens)
    put SiDP first (its CaS decodes in graphs, the default); the lengths themselves TP4, whose single
    request decodes fastest."""
    lengths = tmp_path / "lengths.json"
    lengths.write_text(json.dumps([[500, 100]] * 255 + [[500, 8000]]))
    told = sidp(sidp_workload_file=str(lengths))
    assert resolve_static_fallback(told, LLAMA_8B).node_layout.name() == "tp4"
    means = sidp(sidp_mean_prompt_tokens=500, sidp_mean_output_tokens=131,
                 sidp_num_requests=256)
    assert resolve_static_fallback(means, LLAMA_8B) is means


def test_workload_file_errors_are_named(tmp_path):
    lengths = tmp_path / "lengths.json"
    lengths.write_text("[[500, 100]]")
    with pytest.raises(ValueError, match="sidp_workload_file gives the requests' lengths and "
                                         "count: drop sidp_num_requests"):
        sidp(sidp_workload_file=str(lengths), sidp_num_requests=3)
    lengths.write_text("[[500, 0]]")
    with pytest.raises(ValueError, match=r"give a non-empty JSON list of \[prompt_tokens"):
        design_choice(sidp(sidp_workload_file=str(lengths)), LLAMA_8B)
    with pytest.raises(ValueError, match="workload file .*missing.json"):
        design_choice(sidp(sidp_workload_file=str(tmp_path / "missing.json")), LLAMA_8B)


def shift(gpus: int, **options) -> EngineConfig:
    return EngineConfig(parallel_policy="shift", sequence_parallel_size=gpus,
                        cost_profile=PROFILE, max_num_batched_tokens=8192, **options)


def test_shift_over_sp8_falls_back_where_dp4_x_tp2_serves_a_batch_better(tmp_path):
    """64 prompts of 1024 tokens, 62 output tokens each, on eight GPUs: one SP8 group (TP8 for
    small steps) is predicted below four TP2 replicas; on four GPUs Shift over SP4 beats
    every static plan and runs."""
    batch = dict(shift_mean_prompt_tokens=1024, shift_mean_output_tokens=62,
                 shift_num_requests=64)
    fallen = resolve_static_fallback(shift(8, **batch), LLAMA_8B)
    assert fallen.parallel_policy == "static" and fallen.node_layout.name() == (
        "tp2,tp2@2-3,tp2@4-5,tp2@6-7")
    assert fallen.shift.num_requests is None
    four = shift(4, **batch)
    assert resolve_static_fallback(four, LLAMA_8B) is four
    assert design_choice(four, LLAMA_8B).best.name == "shift-sp4"


def test_a_tie_goes_to_the_static_plan():
    """A light online load: Shift's steps all run its shift plan, TP4, so it predicts what
    TP4 does, and TP4 runs (no policy where it gains nothing)."""
    config = resolve_static_fallback(shift(4, shift_request_rate=4.0), LLAMA_8B)
    assert (config.parallel_policy, config.node_layout.name()) == ("static", "tp4")
    with pytest.raises(ValueError, match="shift_request_rate is an option of the shift policy"):
        EngineConfig(sequence_parallel_size=2, shift_request_rate=4.0)


def test_the_tail_workload_on_two_gpus_falls_back_to_tp2_only_when_its_lengths_are_told():
    """Qwen3-32B, `tail`'s 300 requests (benchmarks/workloads/tail_300.json, what
    benchmarks/workload_lengths.py writes for the bench's seed): measured on two H200s, TP=2
    76 s, DP=2 99 s; told only the means (1,024 and ~450 tokens) the model picks DP=2."""
    tail = SHAPES.parent / "workloads" / "tail_300.json"
    written = runpy.run_path(str(SHAPES.parent / "workload_lengths.py"))["lengths"](
        "tail", 300, 0, False)
    assert json.loads(tail.read_text()) == written
    qwen = SimpleNamespace(**json.loads((SHAPES / "qwen3-32b.json").read_text()))
    common = dict(parallel_policy="sidp", data_parallel_size=2, share_ffn=True,
                  cost_profile=PROFILE, gpu_memory_utilization=0.75, max_model_len=8192)
    told = EngineConfig(sidp_workload_file=str(tail), **common)
    assert resolve_static_fallback(told, qwen).node_layout.name() == "tp2"
    means = EngineConfig(sidp_mean_prompt_tokens=1024, sidp_mean_output_tokens=450,
                         sidp_num_requests=300, **common)
    fallen = resolve_static_fallback(means, qwen)
    assert fallen.parallel_policy == "static" and fallen.plan.name() == "dp2"
