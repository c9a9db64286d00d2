"""EngineConfig's checks of the shared-FFN (SiDP), swap preemption and seesaw auto
options, the layout they give, and their CLI flags."""
import argparse

import pytest

from parashift.config import EngineConfig
from parashift.entrypoints.engine_args import add_engine_args, engine_config_from_args


def test_share_ffn_gives_replicas_of_one_sharing_group():
    config = EngineConfig(data_parallel_size=2, tensor_parallel_size=2, share_ffn=True,
                          sidp_mode="was")
    assert config.node_layout.name() == "tp2+was/0-3,tp2@2-3+was/0-3"
    assert EngineConfig(parallel_policy="sidp", data_parallel_size=2).sidp.share_ffn


@pytest.mark.parametrize("options, message", [
    (dict(share_ffn=True), "data_parallel_size >= 2"),
    (dict(share_ffn=True, data_parallel_size=2, pipeline_parallel_size=2), "plain TP"),
    (dict(share_ffn=True, data_parallel_size=2, parallel_policy="shift"), "static or sidp"),
    (dict(share_ffn=True, data_parallel_size=2, deterministic=True), "deterministic"),
    (dict(sidp_mode="both"), "sidp_mode must be cas or was"),
    (dict(sidp_slots=0), "sidp_slots must be an integer >= 1"),
])
def test_bad_shared_ffn_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**options)


def test_sidp_cli_flags():
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["-dp", "2", "--share-ffn", "--parallel-policy", "sidp",
                              "--sidp-batch-threshold", "512", "--sidp-slots", "3"])
    config = engine_config_from_args(args)
    assert (config.sidp.share_ffn, config.sidp.batch_threshold, config.sidp.slots) == (True, 512, 3)


def test_recompute_is_the_default():
    config = EngineConfig()
    assert (config.preemption_mode, config.swap_space) == ("recompute", None)
    assert EngineConfig(preemption_mode="swap", swap_space=0.5).swap_space == 0.5


@pytest.mark.parametrize("options, message", [
    (dict(preemption_mode="offload"), "preemption_mode must be one of"),
    (dict(preemption_mode="swap"), "needs swap_space > 0"),
    (dict(preemption_mode="swap", swap_space=0), "needs swap_space > 0"),
    (dict(preemption_mode="swap", swap_space=float("nan")), "needs swap_space > 0"),
    (dict(preemption_mode="swap", swap_space=True), "needs swap_space > 0"),
    (dict(swap_space=4.0), "swap_space is an option of preemption_mode='swap'"),
    (dict(preemption_mode="swap", swap_space=1.0, parallel_policy="seesaw", prefill_plan="pp2",
          decode_plan="tp2", cpu_kv_tokens=64), "does not go with the seesaw policy"),
])
def test_bad_swap_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**options)


def test_swap_cli_flags():
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--preemption-mode", "swap", "--swap-space", "2.5"])
    config = engine_config_from_args(args)
    assert (config.preemption_mode, config.swap_space) == ("swap", 2.5)


@pytest.mark.parametrize("plans", [dict(prefill_plan="auto"), dict(prefill_plan="auto:2"),
                                   dict(prefill_plan="auto", decode_plan="auto")])
def test_seesaw_auto_is_accepted_and_resolved_before_the_layout(plans):
    config = EngineConfig(parallel_policy="seesaw", cpu_kv_tokens=64, **plans,
                          seesaw_mean_prompt_tokens=2000, seesaw_mean_output_tokens=200)
    assert config.auto_plans
    with pytest.raises(ValueError, match="resolved at engine start-up"):
        config.node_layout


@pytest.mark.parametrize("options, message", [
    (dict(prefill_plan="automatic"), "must be auto, auto:<ranks per group> .* got 'automatic'"),
    (dict(prefill_plan="auto:0"), "must be auto, auto:<ranks per group>"),
    (dict(prefill_plan="pp2", decode_plan="auto"), "decode_plan must be auto, auto:<ranks"),
    (dict(prefill_plan="auto", decode_plan="tp2"), "omit decode_plan or give 'auto'"),
    (dict(prefill_plan="auto", seesaw_mean_prompt_tokens=0), "must be an integer >= 1"),
    (dict(prefill_plan="auto", seesaw_num_requests=-5), "seesaw_num_requests must be an integer"),
    (dict(prefill_plan="pp2", decode_plan="tp2", seesaw_mean_output_tokens=10),
     "is an option of prefill_plan='auto'"),
])
def test_bad_seesaw_auto_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(parallel_policy="seesaw", cpu_kv_tokens=64, **options)


def test_seesaw_auto_cli_flags():
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--parallel-policy", "seesaw", "--prefill-plan", "auto",
                              "--cpu-kv-gib", "4", "--seesaw-mean-prompt-tokens", "3000",
                              "--seesaw-mean-output-tokens", "200", "--seesaw-num-requests", "128",
                              "--seesaw-resident-weights"])
    config = engine_config_from_args(args)
    assert (config.seesaw.prefill_plan, config.seesaw.decode_plan) == ("auto", None)
    assert (config.seesaw.mean_prompt_tokens, config.seesaw.mean_output_tokens,
            config.seesaw.num_requests) == (3000, 200, 128)
    assert config.seesaw.resident_weights


def test_design_options_nest_under_their_design_and_keep_their_flat_keywords():
    import dataclasses

    from parashift.config import SeesawConfig, option_defaults
    config = EngineConfig(parallel_policy="seesaw", prefill_plan="pp2", decode_plan="tp2",
                          cpu_kv_tokens=64, seesaw_max_prefill_ms=5.0)
    assert config.seesaw == SeesawConfig(prefill_plan="pp2", decode_plan="tp2",
                                         cpu_kv_tokens=64, max_prefill_ms=5.0)
    assert EngineConfig(parallel_policy="seesaw", seesaw=config.seesaw) == config
    assert dataclasses.replace(config, decode_plan="pp2").seesaw.decode_plan == "pp2"
    assert EngineConfig(**config.as_options()) == config
    defaults = option_defaults()
    assert (defaults["shift_threshold"], defaults["sidp_slots"], defaults["flying_preemption"]) \
        == (256, 2, "auto")
    assert "seesaw" not in defaults


def test_unknown_options_are_named():
    with pytest.raises(ValueError, match=r"unknown engine option\(s\) \['seesaw_plan'\]"):
        EngineConfig.from_kwargs(seesaw_plan="pp2")
    with pytest.raises(TypeError, match="seesaw_plan"):
        EngineConfig(seesaw_plan="pp2")
    with pytest.raises(ValueError, match="seesaw must be a SeesawConfig"):
        EngineConfig(seesaw={"prefill_plan": "pp2"})


@pytest.mark.parametrize("value", [-2, 1.5, True, "20"])
def test_bad_max_logprobs_is_named(value):
    with pytest.raises(ValueError, match="max_logprobs"):
        EngineConfig(max_logprobs=value)


def test_max_logprobs_defaults_to_vllms():
    assert EngineConfig().max_logprobs == 20 and EngineConfig(max_logprobs=-1).max_logprobs == -1
