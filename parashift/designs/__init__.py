"""The designs the engine brings together, each registered here once: its options (a
dataclass nested in EngineConfig under the design's name, e.g. `config.seesaw`), the
factory of its policy (`parallel_policy=<name>`) and, where it changes what a rank does,
the factory of its rank hooks (worker/rank_hooks.py). Factories are named "module:function"
and imported when used, so that this registry sits below the engine and the worker.

Adding a design: its options file here, its policy under engine/policy/, its rank hooks
under worker/ where it has any, and one entry in DESIGNS (plus its field in EngineConfig)."""
import dataclasses
import importlib
from dataclasses import dataclass

from parashift.designs.flying import FlyingConfig
from parashift.designs.options import DesignOptions
from parashift.designs.seesaw import SeesawConfig
from parashift.designs.shift import ShiftConfig
from parashift.designs.sidp import SidpConfig


@dataclass(frozen=True)
class Design:
    name: str
    options: type[DesignOptions]
    policy: str                   # "module:function" (config, layout, hf_config) -> Policy
    rank_hooks: str | None = None  # "module:function" (RankSetup) -> RankHooks | None

    def make_policy(self, config, layout, hf_config):
        return _resolve(self.policy)(config, layout, hf_config)

    def make_rank_hooks(self, setup):
        return None if self.rank_hooks is None else _resolve(self.rank_hooks)(setup)


DESIGNS = {design.name: design for design in (
    Design("shift", ShiftConfig, "parashift.engine.policy.shift:policy_from_config"),
    Design("flying", FlyingConfig, "parashift.engine.policy.flying:policy_from_config"),
    Design("seesaw", SeesawConfig, "parashift.engine.policy.seesaw:policy_from_config",
           "parashift.worker.seesaw:rank_hooks_for"),
    Design("sidp", SidpConfig, "parashift.engine.policy.sidp:policy_from_config",
           "parashift.worker.shared_ffn:rank_hooks_for"),
)}


def _resolve(reference: str):
    module, name = reference.split(":")
    return getattr(importlib.import_module(module), name)


def design_keywords() -> dict[str, tuple[str, str]]:
    """Every design's flat keyword -> (design, field)."""
    return {keyword: (design.name, name) for design in DESIGNS.values()
            for keyword, name in design.options.keywords().items()}


def nest_design_options(options: dict) -> dict:
    """`options` with each design's flat keywords (prefill_plan, sidp_slots, ...) gathered
    into its options dataclass under the design's name; a flat keyword given beside the
    dataclass (dataclasses.replace does) overrides its field."""
    rest = dict(options)
    for design in DESIGNS.values():
        keywords = design.options.keywords()
        flat = {keywords[k]: rest.pop(k) for k in list(rest) if k in keywords}
        if not flat:
            continue
        given = rest.get(design.name)
        rest[design.name] = (design.options(**flat) if given is None
                             else dataclasses.replace(given, **flat))
    return rest


def flat_design_options(config) -> dict:
    """Every design's options of `config` by their flat keywords."""
    return {k: v for design in DESIGNS.values() for k, v in getattr(config, design.name).flat().items()}
