"""Which weight quantization runs: asked, detected from config.json, or refused by name."""
from types import SimpleNamespace

import pytest

from parashift.config import EngineConfig
from parashift.quantization.scheme import WeightQuant, weight_quant


def hf(qconfig=None):
    return SimpleNamespace(quantization_config=qconfig) if qconfig else SimpleNamespace()


def ct(weights, acts=None, ignore=("lm_head",)):
    return {"quant_method": "compressed-tensors", "ignore": list(ignore),
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": acts}}}


FP8_CHANNEL = {"num_bits": 8, "type": "float", "strategy": "channel"}


def test_none_or_fp8_asked_of_a_dense_checkpoint():
    assert weight_quant(None, hf()) is None
    assert weight_quant("fp8", hf()) == WeightQuant(serialized=False)


def test_fp8_checkpoints_are_detected_asked_or_not():
    dynamic = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}
    for asked in (None, "fp8"):
        assert weight_quant(asked, hf(ct(FP8_CHANNEL, dynamic))) == WeightQuant(serialized=True)
    static = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}
    assert weight_quant(None, hf(ct(FP8_CHANNEL, static))).static_activations
    hf_fp8 = weight_quant(None, hf({"quant_method": "fp8", "activation_scheme": "dynamic"}))
    assert hf_fp8.serialized and hf_fp8.scale_name == "weight_scale_inv"


@pytest.mark.parametrize("qconfig, words", [
    ({"quant_method": "gptq", "bits": 4}, "'gptq'"),
    ({"quant_method": "awq"}, "'awq'"),
    (ct({"num_bits": 8, "type": "int", "strategy": "channel"}), "int8 weights"),
    (ct({"num_bits": 8, "type": "float", "strategy": "block"}), "block-wise fp8 not supported"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "block-wise fp8 not supported"),
    (ct(FP8_CHANNEL, ignore=["model.layers.0.mlp.down_proj"]), "unquantized"),
])
def test_schemes_not_supported_are_named(qconfig, words):
    with pytest.raises(ValueError, match=words.replace("[", "\\[")):
        weight_quant(None, hf(qconfig))


def test_unknown_options_name_the_supported_ones():
    with pytest.raises(ValueError, match="quantization 'int4' is not supported; supported: "
                                         "\\['fp8'\\]"):
        EngineConfig(quantization="int4")
    with pytest.raises(ValueError, match="kv_cache_dtype 'int8' is not supported"):
        EngineConfig(kv_cache_dtype="int8")
    assert EngineConfig(quantization="fp8", kv_cache_dtype="fp8_e4m3").quantization == "fp8"
