"""Faults injected into one request, for tests that the others go on."""
from parashift.layers.sampler import Sampler

FAILING_SEED = 666


def fail_generator_for_seed(monkeypatch, seed: int = FAILING_SEED) -> None:
    """Making the seeded generator of a request with this seed raises RuntimeError("boom")."""
    real = Sampler.make_generator

    def make_generator(value, device):
        if value == seed:
            raise RuntimeError("boom")
        return real(value, device)

    monkeypatch.setattr(Sampler, "make_generator", staticmethod(make_generator))
