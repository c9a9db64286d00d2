"""The advisor's profiles: which link profile a node of N GPUs reads, `auto` off a GPU, a
Hugging Face config as the model's shape, and EngineConfig's check of `cost_profile`."""
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig

from parashift.config import EngineConfig
from parashift.cost.advisor import PROFILES, advisor_for, load_profiles

COMPUTE = str(PROFILES / "h200_compute.json")


@pytest.mark.parametrize("world,ranks", [(1, None), (2, 2), (3, 4), (4, 4), (8, 4)])
def test_the_narrowest_link_profile_that_covers_the_node(world, ranks):
    compute, link = load_profiles(COMPUTE, world)
    assert compute.device == "H200"
    assert (link.ranks if link else None) == ranks


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU's answer to auto")
def test_auto_without_a_known_gpu_names_what_to_do():
    with pytest.raises(ValueError, match="no committed profile for 'cpu'.*parashift profile"):
        load_profiles("auto", 2)


def test_a_hugging_face_config_gives_the_shape():
    hf = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2)
    advisor = advisor_for(SimpleNamespace(cost_profile=COMPUTE, max_num_seqs=256), hf, 2)
    shape = advisor.model.shape
    assert (shape.num_layers, shape.hidden, shape.num_kv_heads, shape.intermediate) == (2, 64, 2, 128)
    assert advisor_for(SimpleNamespace(cost_profile=None), hf, 2) is None


def test_engine_config_checks_the_profile_path():
    with pytest.raises(ValueError, match="cost_profile must be 'auto' or a compute profile"):
        EngineConfig(cost_profile="no/such/profile.json")
    assert EngineConfig(cost_profile=COMPUTE).cost_profile == COMPUTE
