"""Speculative decoding: proposers (one file each, registered in PROPOSERS by method),
the verification rule (rejection.py) and the engine's driver (speculator.py)."""
from parashift.spec_decode.config import METHODS, SpeculativeConfig
from parashift.spec_decode.ngram import NgramProposer
from parashift.spec_decode.speculator import SpecDecodeStats, Speculator
from parashift.spec_decode.suffix import SuffixProposer


def _draft_model_proposer(config: SpeculativeConfig, engine):
    from parashift.spec_decode.draft_model import DraftModelProposer  # loads a model
    return DraftModelProposer(config, engine)


# method -> proposer factory (config, the engine: its config, device, dtype, tokenizer)
PROPOSERS = {
    "ngram": lambda config, engine: NgramProposer(config),
    "suffix": lambda config, engine: SuffixProposer(config),
    "draft_model": _draft_model_proposer,
}
assert set(PROPOSERS) == set(METHODS)


def make_speculator(config: SpeculativeConfig | None, engine) -> Speculator | None:
    if config is None:
        return None
    return Speculator(config, PROPOSERS[config.method](config, engine))


__all__ = ["PROPOSERS", "SpecDecodeStats", "SpeculativeConfig", "Speculator",
           "make_speculator"]
