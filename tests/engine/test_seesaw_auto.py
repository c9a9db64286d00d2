"""prefill_plan='auto' at start-up: the hardware probe (quick on the CPU, cached as JSON
that a later start reads back) and the config it resolves to: a seesaw pair, or a static
plan under the static policy."""
import json
import time
from dataclasses import asdict
from types import SimpleNamespace

import pytest
import torch

from parashift.config import EngineConfig
from parashift.cost.shape import SHAPES
from parashift.engine import seesaw_auto as seesaw_auto_module
from parashift.engine.hardware_probe import cache_dir, probe_hardware
from parashift.engine.seesaw_auto import ranks_per_group, resolve_auto_plans
from tests.engine.policy.test_seesaw_cost import A10_PCIE, H100_NVLINK

CPU = torch.device("cpu")
LLAMA_8B = SimpleNamespace(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
                           num_key_value_heads=8, intermediate_size=14336, vocab_size=128256)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PARASHIFT_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_the_cpu_probe_is_quick_and_cached(cache):
    start = time.perf_counter()
    measured = probe_hardware(CPU)
    assert time.perf_counter() - start < 1.0
    assert cache_dir() == cache and measured.link == "cpu"
    path = cache / "probe-cpu.json"
    assert json.loads(path.read_text()) == asdict(measured)
    path.write_text(json.dumps(asdict(A10_PCIE)))  # another machine's rates, by hand
    assert probe_hardware(CPU) == A10_PCIE


def seesaw_auto(**options) -> EngineConfig:
    defaults = dict(seesaw_mean_prompt_tokens=3000, seesaw_mean_output_tokens=200,
                    prefill_plan="auto:2")
    return EngineConfig(parallel_policy="seesaw", cpu_kv_tokens=400_000,
                        max_num_batched_tokens=8192, gpu_memory_utilization=1.0,
                        **{**defaults, **options})


def resolve(config, hardware, cache):
    (cache / "probe-cpu.json").write_text(json.dumps(asdict(hardware)))
    return resolve_auto_plans(config, LLAMA_8B, torch.bfloat16, CPU)


def test_nvlink_rates_resolve_to_a_static_plan_under_the_static_policy(cache):
    config = resolve(seesaw_auto(data_parallel_size=2), H100_NVLINK, cache)
    assert config.parallel_policy == "static" and not config.auto_plans
    assert (config.seesaw.prefill_plan, config.seesaw.cpu_kv_tokens,
            config.seesaw.mean_prompt_tokens) == (None, None, None)
    # dp2 within each of the two groups: four replicas
    assert config.data_parallel_size == 4
    assert config.node_layout.name() == "single,single@1,single@2,single@3"


def test_pcie_rates_resolve_to_a_seesaw_pair(cache):
    """1,000 output tokens: the pair beats PP2 by more than PAIR_MARGIN (200: by 2%)."""
    assert resolve(seesaw_auto(), A10_PCIE, cache).parallel_policy == "static"
    config = resolve(seesaw_auto(seesaw_mean_output_tokens=1000), A10_PCIE, cache)
    assert config.parallel_policy == "seesaw"
    assert (config.seesaw.prefill_plan, config.seesaw.decode_plan) == ("pp2", "tp2")
    assert config.seesaw.cpu_kv_tokens == 400_000 and config.node_layout.name() == "pp2"


def test_the_number_of_requests_reaches_the_cost_model(cache):
    """Decode-heavy work on NVLink: steady state (every replica full) rates DP=2 first, 128
    requests at once TP=2 (benchmarks/seesaw.py's `chat`, test_seesaw_cost.py)."""
    chat = dict(seesaw_mean_prompt_tokens=592, seesaw_mean_output_tokens=571)
    steady = resolve(seesaw_auto(**chat), H100_NVLINK, cache)
    batch = resolve(seesaw_auto(**chat, seesaw_num_requests=128), H100_NVLINK, cache)
    assert steady.node_layout.name() == "single,single@1"
    assert batch.node_layout.name() == "tp2" and batch.parallel_policy == "static"
    assert batch.seesaw.num_requests is None  # cleared with the other auto options


def test_other_configs_are_left_alone_and_the_ranks_are_named_on_the_cpu():
    plain = EngineConfig(parallel_policy="seesaw", prefill_plan="pp2", decode_plan="tp2",
                         cpu_kv_tokens=64)
    assert resolve_auto_plans(plain, LLAMA_8B, torch.bfloat16, CPU) is plain
    assert ranks_per_group(seesaw_auto(), CPU) == 2
    bare = EngineConfig(parallel_policy="seesaw", prefill_plan="auto", cpu_kv_tokens=64)
    with pytest.raises(ValueError, match="prefill_plan='auto:2'"):
        ranks_per_group(bare, CPU)


PROFILE = str(SHAPES.parent / "results" / "profiles" / "h200_compute.json")
LLAMA_8B_SHAPE = SimpleNamespace(**json.loads((SHAPES / "llama-3.1-8b.json").read_text()))


def with_profile(**options) -> EngineConfig:
    return seesaw_auto(prefill_plan="auto:4", cost_profile=PROFILE, **options)


def test_with_a_cost_profile_the_step_model_chooses_online_by_latency_offline_by_throughput():
    """The planner's predictions (cost/forecast.py), not the roofline: 2 req/s of 3000-token
    prompts runs TP4 (a request's latency), 128 at once DP4 (throughput), and with 2000
    output tokens each TP4 (its KV holds the batch); no pair wins by PAIR_MARGIN."""
    chosen = {}
    for name, options in (("online", dict(seesaw_request_rate=2.0)),
                          ("offline", dict(seesaw_num_requests=128)),
                          ("long", dict(seesaw_num_requests=128, seesaw_mean_output_tokens=2000))):
        config = resolve_auto_plans(with_profile(**options), LLAMA_8B_SHAPE, torch.bfloat16, CPU)
        assert config.parallel_policy == "static" and config.seesaw.request_rate is None
        chosen[name] = config.node_layout.name()
    assert chosen == {"online": "tp4", "offline": "single,single@1,single@2,single@3",
                      "long": "tp4"}


def test_with_a_cost_profile_a_pair_that_wins_by_the_margin_runs(monkeypatch):
    monkeypatch.setattr(seesaw_auto_module, "PAIR_MARGIN", -10.0)  # any pair wins
    config = resolve_auto_plans(with_profile(seesaw_num_requests=128), LLAMA_8B_SHAPE,
                                torch.bfloat16, CPU)
    assert config.parallel_policy == "seesaw" and config.seesaw.decode_plan == "tp4"
    assert config.seesaw.prefill_plan in ("pp2xtp2", "pp4")


def test_the_request_rate_is_an_auto_option_and_positive():
    with pytest.raises(ValueError, match="seesaw_request_rate is an option of prefill_plan='auto'"):
        EngineConfig(parallel_policy="seesaw", prefill_plan="pp2", decode_plan="tp2",
                     cpu_kv_tokens=64, seesaw_request_rate=1.0)
    with pytest.raises(ValueError, match="seesaw_request_rate must be a number > 0"):
        with_profile(seesaw_request_rate=0)


def test_the_workload_file_and_the_rate_need_the_cost_model(tmp_path):
    lengths = tmp_path / "lengths.json"
    lengths.write_text(json.dumps([[3000, 200]] * 8))
    told = dict(seesaw_mean_prompt_tokens=None, seesaw_mean_output_tokens=None,
                seesaw_workload_file=str(lengths))
    config = resolve_auto_plans(with_profile(**told), LLAMA_8B_SHAPE, torch.bfloat16, CPU)
    assert config.parallel_policy == "static" and config.seesaw.workload_file is None
    with pytest.raises(ValueError, match="seesaw_workload_file is read by the cost model"):
        seesaw_auto(**told)
    with pytest.raises(ValueError, match="drop seesaw_mean_prompt_tokens"):
        with_profile(seesaw_workload_file=str(lengths))
