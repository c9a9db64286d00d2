"""Which seesaw ranks ask their group for the peer path (worker/peer_weights.py): asked for
by name anywhere, by default only on GPUs with a safetensors checkpoint, never with both
plans resident."""
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
    ("auto", False, GPU, RANDOM, False),
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
