"""--deterministic reaches the engine config; the combinations it does not cover are errors
that say so."""
import argparse

import pytest
import torch

from parashift.attention.backend import get_backend
from parashift.attention.torch_invariant import InvariantTorchAttentionBackend
from parashift.config import EngineConfig
from parashift.entrypoints.engine_args import add_engine_args, engine_config_from_args


def test_flag_sets_the_config():
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert engine_config_from_args(parser.parse_args(["--deterministic"])).deterministic
    assert not engine_config_from_args(parser.parse_args([])).deterministic


@pytest.mark.parametrize("options, message", [
    (dict(deterministic="yes"), "deterministic must be true or false"),
])
def test_unsupported_combinations_are_errors(options, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**{"deterministic": True, **options})


def test_backends():
    assert isinstance(get_backend("auto", torch.device("cpu"), deterministic=True),
                      InvariantTorchAttentionBackend)
    with pytest.raises(ValueError, match="needs the triton attention backend"):
        get_backend("torch", torch.device("cuda"), deterministic=True)


def test_engine_rejects_a_tp_degree_outside_the_canonical_chunks(tmp_path):
    """16 heads allow TP=16, but the canonical order has lcm(1, 2, 4, 8) = 8 chunks (degrees
    up to MAX_TP): refused before any worker starts."""
    from tests.engine.conftest import save_tiny_llama, tiny_llm
    model = save_tiny_llama(tmp_path, num_attention_heads=16, num_key_value_heads=16)
    with pytest.raises(ValueError, match="tp = 16, which does not divide the 8 K chunks"):
        tiny_llm(model, deterministic=True, tensor_parallel_size=16)
