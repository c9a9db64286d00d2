"""What a user tells a design's start-up choice of the load it will serve (Seesaw's `auto`,
SiDP's fallback: cost/plan_choice.py): mean lengths, or the lengths themselves from a file
(a sample, or an offline batch's every request: a tail of long requests or a spread of
prompts changes which plan finishes first, which means alone cannot show), and an offline
batch's request count or the online arrival rate, or the arrival times themselves (a trace
whose bursts the forecast sees: cost/forecast_trace.py)."""
import json
import math
from dataclasses import dataclass

from parashift.cost.runs import Engine

STEADY_SEATS = 2  # no count, no rate: this many full batches a rank (steady throughput)
DEFAULT_PROMPT_TOKENS, DEFAULT_OUTPUT_TOKENS = 1024, 128  # vLLM's benchmark lengths


@dataclass(frozen=True)
class WorkloadHint:
    """Mean lengths, and an offline batch's request count or the online arrival rate
    (neither: steady state, every replica's seats full); `lengths`, where given, are the
    requests (prompt, output) themselves, and `arrivals` their arrival times (online)."""
    prompt_tokens: int
    output_tokens: int
    num_requests: int | None = None
    request_rate: float | None = None  # requests a second
    lengths: tuple[tuple[int, int], ...] = ()
    arrivals: tuple[float, ...] = ()   # the requests' arrival times (s), where known

    def __post_init__(self):
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError("a workload's mean prompt and output tokens must be >= 1, got "
                             f"{self.prompt_tokens} and {self.output_tokens}")
        if self.request_rate is not None and not self.request_rate > 0:
            raise ValueError(f"a workload's request rate must be > 0, got {self.request_rate}")
        if self.arrivals and len(self.arrivals) != len(self.lengths):
            raise ValueError(f"a workload's arrival times go with its lengths, one a request: "
                             f"{len(self.arrivals)} times for {len(self.lengths)} requests")

    @property
    def offline(self) -> bool:
        return self.request_rate is None

    def requests(self, world_size: int, engine: Engine) -> tuple[list[tuple[int, int]], float]:
        """(input, output) per request and their rate (inf: all at t=0)."""
        rate = math.inf if self.request_rate is None else self.request_rate
        if self.lengths:
            return list(self.lengths), rate
        count = self.num_requests or STEADY_SEATS * engine.max_num_seqs * world_size
        return [(self.prompt_tokens, self.output_tokens)] * count, rate


def load_lengths(path: str) -> tuple[tuple[tuple[int, int], ...], tuple[float, ...]]:
    """A JSON list of [prompt tokens, output tokens] pairs, one a request, or of
    [prompt tokens, output tokens, arrival seconds] triples (an online trace: the forecast
    then sees its bursts, not only its mean rate); the lengths and the arrival times."""
    try:
        with open(path) as f:
            rows = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"workload file {path}: {e}") from None
    ok = isinstance(rows, list) and rows and all(
        isinstance(r, list) and len(r) == len(rows[0]) in (2, 3) and all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in r[:2])
        and all(isinstance(t, (int, float)) and not isinstance(t, bool) and t >= 0
                for t in r[2:]) for r in rows)
    if not ok:
        raise ValueError(f"workload file {path}: give a non-empty JSON list of "
                         "[prompt_tokens, output_tokens] pairs of integers >= 1, or of "
                         "[prompt_tokens, output_tokens, arrival_s] triples (arrival_s >= 0)")
    return tuple((r[0], r[1]) for r in rows), tuple(float(r[2]) for r in rows if len(r) == 3)


def hint_of(options) -> WorkloadHint:
    """The hint in a design's options (`mean_prompt_tokens`, `mean_output_tokens`,
    `num_requests`, `request_rate`, `workload_file`; unset lengths: vLLM's benchmark's)."""
    if options.workload_file is None:
        return WorkloadHint(options.mean_prompt_tokens or DEFAULT_PROMPT_TOKENS,
                            options.mean_output_tokens or DEFAULT_OUTPUT_TOKENS,
                            options.num_requests, options.request_rate)
    lengths, arrivals = load_lengths(options.workload_file)
    span = max(arrivals, default=0.0) - min(arrivals, default=0.0)
    if span <= 0:  # no trace, or every request at t=0
        arrivals = ()
    rate = options.request_rate or ((len(arrivals) - 1) / span if arrivals else None)
    return WorkloadHint(round(sum(p for p, _ in lengths) / len(lengths)),
                        round(sum(o for _, o in lengths) / len(lengths)), len(lengths),
                        rate, lengths, arrivals)
