"""What a request's output must follow: vLLM's StructuredOutputsParams (one of json,
regex, choice, grammar, json_object)."""
import json
from dataclasses import dataclass, fields

CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass
class StructuredOutputsParams:
    json: str | dict | None = None        # a JSON schema (a dict, or its JSON text)
    regex: str | None = None
    choice: list[str] | None = None       # the output is exactly one of these strings
    grammar: str | None = None            # an EBNF grammar (GBNF syntax) with a `root` rule
    json_object: bool | None = None       # any JSON object

    def __post_init__(self):
        given = [name for name in CONSTRAINTS if getattr(self, name) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"structured_outputs needs exactly one of {', '.join(CONSTRAINTS)}; "
                             f"got {', '.join(given) or 'none'}")
        if isinstance(self.json, str):
            try:
                self.json = json.loads(self.json)
            except json.JSONDecodeError as exc:
                raise ValueError(f"structured_outputs.json is not valid JSON: {exc}") from None
        if self.json is not None and not isinstance(self.json, (dict, bool)):
            raise ValueError("structured_outputs.json must be a JSON schema (an object)")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string")
        if self.choice is not None and (not isinstance(self.choice, list) or not self.choice or any(
                not isinstance(c, str) or not c for c in self.choice)):
            raise ValueError("structured_outputs.choice must be a non-empty list of non-empty "
                             "strings")
        if self.json_object not in (None, True, False):
            raise ValueError("structured_outputs.json_object must be a boolean")

    @property
    def kind(self) -> str:
        return next(f.name for f in fields(self) if getattr(self, f.name) not in (None, False))

    def key(self) -> tuple[str, str]:
        """The constraint as a hashable key (a schema as its JSON text)."""
        value = getattr(self, self.kind)
        if self.kind in ("json", "choice"):
            return self.kind, json.dumps(value)  # key order kept: it orders the output
        return self.kind, str(value)
