"""EngineConfig's checks of the swap preemption options, and their CLI flags."""
import argparse

import pytest

from parashift.config import EngineConfig
from parashift.entrypoints.engine_args import add_engine_args, engine_config_from_args


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


def test_cli_flags():
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--preemption-mode", "swap", "--swap-space", "2.5"])
    config = engine_config_from_args(args)
    assert (config.preemption_mode, config.swap_space) == ("swap", 2.5)
