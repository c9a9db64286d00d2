"""Per-request sampling options, named and validated as in vLLM."""
import dataclasses
import math
from dataclasses import dataclass

from parashift.structured.params import StructuredOutputsParams

# Temperatures below this are treated as greedy: dividing logits by them overflows float32.
_SAMPLING_EPS = 1e-5
# Seeds are 64-bit signed integers (vLLM's range; torch.Generator takes no more than 64 bits).
SEED_MIN, SEED_MAX = -2**63, 2**63 - 1


OUTPUT_KINDS = ("cumulative", "delta", "final_only")


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    # the top alternatives' logprobs at each prompt position (with the prompt token's); the
    # first prompt token has none (RequestOutput.prompt_logprobs[0] is None)
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    best_of: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    structured_outputs: StructuredOutputsParams | None = None  # constrains the output
    # "cumulative": an output every step (streaming), each with all the text and tokens so far;
    # "delta": an output every step with only what is new since the last one (no per-step
    # copy of a growing output); "final_only": one when the request ends (vLLM's
    # RequestOutputKind; LLM.generate asks for it, which saves the per-step outputs)
    output_kind: str = "cumulative"

    def __post_init__(self):
        self.verify()

    def final_only(self) -> "SamplingParams":
        """These parameters asking for the request's last output only (the engine makes
        no other)."""
        if self.output_kind == "final_only":
            return self
        return dataclasses.replace(self, output_kind="final_only")

    def verify(self) -> None:
        """Raises ValueError naming the first bad option. The engine calls it again when a
        request is added, since a dataclass can be changed after it was built."""
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        for name in ("n", "best_of", "top_k", "max_tokens", "logprobs", "prompt_logprobs", "seed"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if self.output_kind not in OUTPUT_KINDS:
            raise ValueError(f"output_kind must be one of {OUTPUT_KINDS}, got {self.output_kind!r}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.best_of is not None and self.best_of < self.n:
            raise ValueError(f"best_of must be >= n ({self.n}), got {self.best_of}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (disabled) or >= 1, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be >= 0, got {self.logprobs}")
        if self.prompt_logprobs is not None and self.prompt_logprobs < 0:
            raise ValueError(f"prompt_logprobs must be >= 0, got {self.prompt_logprobs}")
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise ValueError(f"seed must be in [{SEED_MIN}, {SEED_MAX}] (a 64-bit signed "
                             f"integer), got {self.seed}")
        self._verify_penalties()
        if self.structured_outputs is not None and not isinstance(
                self.structured_outputs, StructuredOutputsParams):
            raise ValueError("structured_outputs must be a StructuredOutputsParams")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        if any(not isinstance(s, str) or s == "" for s in self.stop):
            raise ValueError("stop strings must be non-empty strings")
        self.stop_token_ids = list(self.stop_token_ids or [])
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0
               for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative integers, got "
                             f"{self.stop_token_ids}")

    def _verify_penalties(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.logit_bias is None:
            return
        if not isinstance(self.logit_bias, dict):
            raise ValueError(f"logit_bias must map token ids to biases, got {self.logit_bias!r}")
        for token, bias in self.logit_bias.items():
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got "
                                 f"{token!r}")
            if isinstance(bias, bool) or not isinstance(bias, (int, float)) \
                    or not -100.0 <= bias <= 100.0:
                raise ValueError(f"logit_bias values must be numbers in [-100, 100], got "
                                 f"{bias!r} for token {token}")

    @property
    def num_samples(self) -> int:
        """Sequences generated for the request: best_of, else n."""
        return self.best_of or self.n

    @property
    def uses_history(self) -> bool:
        """The sampler needs the request's prompt and output tokens (penalties)."""
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)

    @property
    def greedy(self) -> bool:
        return self.temperature < _SAMPLING_EPS or self.top_k == 1

    @property
    def argmax_only(self) -> bool:
        """The sampler's token is the argmax of the raw logits, and it returns nothing else:
        greedy, with no logprobs, logit bias, penalties or structured output."""
        return (self.greedy and self.logprobs is None and not self.logit_bias
                and not self.uses_history and self.structured_outputs is None)


def check_max_logprobs(params: SamplingParams, max_logprobs: int) -> None:
    """ValueError naming the field when a request asks for more logprobs per token than the
    engine's max_logprobs (vLLM's --max-logprobs; -1: no cap)."""
    if max_logprobs < 0:
        return
    for name in ("logprobs", "prompt_logprobs"):
        asked = getattr(params, name, None)
        if asked is not None and asked > max_logprobs:
            raise ValueError(f"{name} {asked} is more than this engine's max_logprobs "
                             f"({max_logprobs}); ask for fewer, or start it with a higher "
                             "--max-logprobs")
