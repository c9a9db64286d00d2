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
