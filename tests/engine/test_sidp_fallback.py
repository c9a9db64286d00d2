"""The sidp policy's start-up check with the cost model and the workload told: SiDP runs
where the model puts it ahead of every static plan of its GPUs, else the best static plan
runs under the static policy (8B shape, committed H200 profiles)."""
import json
from types import SimpleNamespace

import pytest

from parashift.config import EngineConfig
from parashift.cost.shape import SHAPES
from parashift.engine.sidp_fallback import resolve_sidp_fallback, sidp_choice

PROFILE = str(SHAPES.parent / "results" / "profiles" / "h200_compute.json")
LLAMA_8B = SimpleNamespace(**json.loads((SHAPES / "llama-3.1-8b.json").read_text()))


def sidp(**options) -> EngineConfig:
    return EngineConfig(parallel_policy="sidp", data_parallel_size=4, cost_profile=PROFILE,
                        max_num_batched_tokens=8192, **options)


def test_a_light_online_load_falls_back_to_tp(caplog):
    config = resolve_sidp_fallback(sidp(sidp_mean_prompt_tokens=1024, sidp_request_rate=4.0),
                                   LLAMA_8B)
    assert config.parallel_policy == "static" and not config.sidp.share_ffn
    assert config.node_layout.name() == "tp4" and config.sidp.request_rate is None
    assert "the static plan tp4 is predicted to serve this workload better" in caplog.text


def test_where_sidp_is_predicted_ahead_it_runs():
    told = sidp(sidp_mean_prompt_tokens=1024, sidp_mean_output_tokens=64, sidp_num_requests=64)
    assert resolve_sidp_fallback(told, LLAMA_8B) is told
    choice = sidp_choice(told, LLAMA_8B)
    assert choice.best.name == "sidp-dp4" and not choice.static
    assert choice.best.detail["b_th"] == 4698  # the model's crossover at d = 4


def test_untold_it_is_left_alone_and_the_hints_need_the_cost_model():
    plain = sidp()
    assert resolve_sidp_fallback(plain, LLAMA_8B) is plain
    with pytest.raises(ValueError, match="sidp_request_rate is an option of the sidp policy "
                                         "with cost_profile"):
        EngineConfig(parallel_policy="sidp", data_parallel_size=2, sidp_request_rate=2.0)
    with pytest.raises(ValueError, match="sidp_num_requests must be an integer >= 1"):
        sidp(sidp_num_requests=0)
    with pytest.raises(ValueError, match="sidp_request_rate must be a number > 0"):
        sidp(sidp_request_rate=-1.0)
