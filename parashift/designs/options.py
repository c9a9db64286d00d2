"""What every design's options share: each field's flat keyword (the name `LLM(...)`,
`EngineConfig(...)` and the CLI flag give it, e.g. SeesawConfig.max_prefill_ms is
seesaw_max_prefill_ms) and the checks against the rest of the engine's config."""
from dataclasses import fields
from typing import ClassVar


class DesignOptions:
    """Base of a design's options dataclass (validated in its own `__post_init__`)."""
    prefix: ClassVar[str] = ""                   # of the flat keywords
    unprefixed: ClassVar[tuple[str, ...]] = ()   # fields whose keyword is their name

    @classmethod
    def keywords(cls) -> dict[str, str]:
        """Flat keyword -> field name."""
        return {(f.name if f.name in cls.unprefixed else cls.prefix + f.name): f.name
                for f in fields(cls)}

    def flat(self) -> dict:
        """The options by their flat keywords."""
        return {keyword: getattr(self, name) for keyword, name in self.keywords().items()}

    def check(self, engine) -> None:
        """Checks against the engine's other options (`engine`: the EngineConfig)."""


def check_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def check_positive_number(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number > 0, got {value!r}")


# What a design's start-up choice is told of the load (cost/workload_hint.py), by field name
HINT_FIELDS = ("mean_prompt_tokens", "mean_output_tokens", "num_requests", "request_rate",
               "workload_file")


def hinted(options) -> bool:
    """Whether the load was told (a design's start-up may then fall back to a static plan)."""
    return any(getattr(options, name) is not None for name in HINT_FIELDS)


def check_hint_use(prefix: str, options, engine, policy: str) -> None:
    """The hint fields are the `policy`'s, read by the cost model (`cost_profile`)."""
    if hinted(options) and (engine.parallel_policy != policy or engine.cost_profile is None):
        given = next(name for name in HINT_FIELDS if getattr(options, name) is not None)
        raise ValueError(f"{prefix}{given} is an option of the {policy} policy with "
                         "cost_profile (the cost model compares it with the static plans)")


def check_workload_hint(prefix: str, options) -> None:
    """Lengths and counts integers >= 1, a rate > 0; a workload file gives the lengths and
    the count itself."""
    for name in HINT_FIELDS[:3]:
        if getattr(options, name) is not None:
            check_positive_int(prefix + name, getattr(options, name))
    if options.request_rate is not None:
        check_positive_number(prefix + "request_rate", options.request_rate)
    if options.workload_file is not None:
        given = [name for name in HINT_FIELDS[:3] if getattr(options, name) is not None]
        if given:
            raise ValueError(f"{prefix}workload_file gives the requests' lengths and count: "
                             f"drop {prefix}{given[0]}")
