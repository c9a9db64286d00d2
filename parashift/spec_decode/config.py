"""`--speculative-config` / `LLM(speculative_config=...)`: vLLM's keys, validated here."""
import json
from dataclasses import dataclass, fields

METHODS = ("ngram", "suffix", "draft_model")
# keys that only some methods read: given to another method they are an error
_METHOD_KEYS = {
    "ngram": {"prompt_lookup_min", "prompt_lookup_max"},
    "suffix": {"suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests",
               "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob"},
    "draft_model": {"model"},
}


@dataclass
class SpeculativeConfig:
    """How the engine drafts tokens that one verification step checks. Every method here
    drafts deterministically (a point-mass proposal), so verification keeps the target
    distribution by accepting a draft token where the target's own sample equals it."""
    method: str = "ngram"
    num_speculative_tokens: int = 4          # k: the most tokens drafted for one step
    # ngram (prompt lookup): the longest and shortest suffix of the context matched
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    # suffix (SuffixDecoding): the pattern length matched (the trie's depth), the finished
    # requests whose outputs the global trie holds, draft tokens per matched token, and
    # the least estimated probability of a draft path (below it the draft stops)
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 1000
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1
    # draft_model: the draft model (a directory, .gguf or config .json; same tokenizer)
    model: str | None = None

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"speculative_config: method must be one of {METHODS}, got "
                             f"{self.method!r}")
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
                     "suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"speculative_config: {name} must be an integer >= 1, "
                                 f"got {value!r}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError("speculative_config: prompt_lookup_min must be <= "
                             f"prompt_lookup_max, got {self.prompt_lookup_min} > "
                             f"{self.prompt_lookup_max}")
        if not self.suffix_decoding_max_spec_factor > 0:
            raise ValueError("speculative_config: suffix_decoding_max_spec_factor must be > 0, "
                             f"got {self.suffix_decoding_max_spec_factor!r}")
        if not 0 <= self.suffix_decoding_min_token_prob <= 1:
            raise ValueError("speculative_config: suffix_decoding_min_token_prob must be in "
                             f"[0, 1], got {self.suffix_decoding_min_token_prob!r}")
        if self.method == "draft_model" and not self.model:
            raise ValueError("speculative_config: method 'draft_model' needs 'model' (the "
                             "draft model's directory, .gguf or config .json)")

    @classmethod
    def parse(cls, value) -> "SpeculativeConfig | None":
        """From a SpeculativeConfig, a dict or its JSON text (the CLI's); None stays None.
        A key no method knows, or one of another method, is an error."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"speculative_config is not valid JSON ({exc}): {value!r}") \
                    from None
        if not isinstance(value, dict):
            raise ValueError("speculative_config must be a JSON object (a dict), got "
                             f"{type(value).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"speculative_config: unknown key(s) {unknown}; known: "
                             f"{sorted(known)}")
        method = value.get("method", cls.method)
        foreign = sorted(key for other, keys in _METHOD_KEYS.items() if other != method
                         for key in keys if key in value)
        if foreign:
            raise ValueError(f"speculative_config: {foreign} do not apply to method "
                             f"{method!r}")
        return cls(**value)
