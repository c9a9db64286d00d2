import os

import pytest
import torch
from torch import nn

from parashift.loader.weights import init_random_weights

DEVICE = os.environ.get("PARASHIFT_TEST_DEVICE", "cpu")


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 48, bias=False, device=DEVICE)
        self.up = nn.Linear(48, 96, bias=False, device=DEVICE)
        self.norm = nn.LayerNorm(48, device=DEVICE)


def drawn_after(other_draws: int, seed: int = 0) -> list[torch.Tensor]:
    """The weights a process draws after it drew `other_draws` numbers from the default
    generators (what a replica's first worker and its replacement may differ in)."""
    torch.randn(other_draws, device=DEVICE)
    model = Tiny()
    init_random_weights(model, seed)
    return [p.detach().clone() for p in model.parameters()]


def test_random_weights_do_not_depend_on_earlier_draws():
    first, replacement = drawn_after(0), drawn_after(1000)
    assert all(torch.equal(a, b) for a, b in zip(first, replacement))


def test_random_weights_follow_the_seed():
    assert not torch.equal(drawn_after(0, seed=0)[0], drawn_after(0, seed=1)[0])
    model = Tiny()
    init_random_weights(model, 0)
    assert (model.proj.weight.std() - 0.02).abs() < 0.005
    assert torch.equal(model.norm.weight, torch.ones_like(model.norm.weight))


def test_a_model_on_the_meta_device_is_left_as_it_is():
    with torch.device("meta"):
        model = nn.Linear(8, 4)
    init_random_weights(model, 0)
    assert model.weight.is_meta
