"""Which seesaw ranks ask their group for the peer path (worker/peer_weights.py): asked for
by name anywhere, by default only on GPUs with a safetensors checkpoint or random weights,
never with both plans resident; random weights lay out their group's arenas as a
checkpoint of their config would."""
from types import SimpleNamespace

import pytest
import torch

from parashift.config import EngineConfig
from parashift.worker.peer_weights import asks_peer_path

SEESAW = dict(parallel_policy="seesaw", prefill_plan="pp2", decode_plan="tp2", cpu_kv_tokens=10)
CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)
CHECKPOINT, RANDOM = SimpleNamespace(kind="hf"), SimpleNamespace(kind="random")


@pytest.mark.parametrize("wanted, resident, device, source, asks", [
    ("auto", False, GPU, CHECKPOINT, True),
    ("auto", False, GPU, RANDOM, True),
    ("auto", False, CPU, CHECKPOINT, False),
    ("peers", False, CPU, CHECKPOINT, True),
    ("peers", False, GPU, CHECKPOINT, True),
    ("host", False, GPU, CHECKPOINT, False),
    ("auto", True, GPU, CHECKPOINT, False),
])
def test_asks_peer_path(wanted, resident, device, source, asks):
    config = EngineConfig(**SEESAW, seesaw_weight_source=wanted,
                          seesaw_resident_weights=resident)
    assert asks_peer_path(config, device, source) is asks


def test_default_is_auto_and_resident_weights_take_it():
    assert EngineConfig().seesaw.weight_source == "auto"
    assert EngineConfig(**SEESAW, seesaw_resident_weights=True).seesaw.resident_weights


def test_auto_keeps_host_copies_for_a_group_across_hosts():
    across = EngineConfig(**SEESAW, nnodes=2, gpus_per_node=1, allow_cross_host_tp=True)
    assert not asks_peer_path(across, GPU, CHECKPOINT)
    assert asks_peer_path(EngineConfig(**SEESAW, nnodes=2, gpus_per_node=1,
                                       allow_cross_host_tp=True, seesaw_weight_source="peers"),
                          GPU, CHECKPOINT)


@pytest.mark.parametrize("tied", [False, True])
def test_random_weights_lay_out_their_group_as_a_checkpoint_of_their_config(tmp_path, tied):
    from parashift.loader.source import ModelSource, load_hf_config, resolve_model
    from parashift.loader.weight_pieces import checkpoint_shapes, config_checkpoint_shapes
    from parashift.parallel.plan import Plan
    from parashift.worker.peer_weights import load_group_weights
    from tests.engine.conftest import save_tiny_llama
    path = save_tiny_llama(tmp_path, num_hidden_layers=4, tie_word_embeddings=tied)
    source = resolve_model(path)
    hf_config = load_hf_config(source)
    assert config_checkpoint_shapes(hf_config) == checkpoint_shapes(source.path)
    plans = [Plan.parse("pp2"), Plan.parse("tp2")]
    random = ModelSource("random", source.path, "tiny")
    assert load_group_weights(hf_config, random, plans, torch.float32, 64) == \
        load_group_weights(hf_config, source, plans, torch.float32, 64)
