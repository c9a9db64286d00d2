"""Which seesaw ranks ask their group for the peer path (worker/peer_weights.py): asked
for by name anywhere, by default only on GPUs, never with both plans resident."""
import pytest
import torch

from parashift.config import EngineConfig
from parashift.worker.peer_weights import asks_peer_path

SEESAW = dict(parallel_policy="seesaw", prefill_plan="pp2", decode_plan="tp2", cpu_kv_tokens=10)
CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)


@pytest.mark.parametrize("source, resident, device, asks", [
    ("auto", False, GPU, True),
    ("auto", False, CPU, False),
    ("peers", False, CPU, True),
    ("peers", False, GPU, True),
    ("host", False, GPU, False),
    ("auto", True, GPU, False),
])
def test_asks_peer_path(source, resident, device, asks):
    config = EngineConfig(**SEESAW, seesaw_weight_source=source,
                          seesaw_resident_weights=resident)
    assert asks_peer_path(config, device) is asks


def test_default_is_auto_and_resident_weights_take_it():
    assert EngineConfig().seesaw_weight_source == "auto"
    assert EngineConfig(**SEESAW, seesaw_resident_weights=True).seesaw_resident_weights
