"""The mean context of the decode steps benchmarks/decode_throughput.py (and the scripts that
call its `start_decodes`: sidp_probe.py, deterministic.py) times, worked out from how it
starts them: `batch` prompts of `context` tokens are added at once and the engine steps
until all have prefilled, each step's budget taken first by the decodes of the sequences
already prefilled (one token each) and the rest by the waiting prompts in order, chunked;
then `warm` more steps; then `steps` timed steps. A sequence admitted early has decoded
while the later ones prefilled, so the timed steps' mean context is above `context` by
more than half the timed steps, the more so the more prefill steps the batch took.

The engine's own record (decode_throughput.py's `mean_context`, the number of computed
tokens averaged over the timed steps) is what this reproduces: issue 58's raw outputs
(batch 64 and 256, budget 16,384, 32 steps) to the last digit."""


def mean_context(context: int, batch: int, steps: int, budget: int, warm: int = 3) -> float:
    """Mean tokens before a timed step's query token, over the batch and the timed steps."""
    if min(context, batch, steps, budget) < 1 or warm < 0:
        raise ValueError(f"mean_context needs positive sizes, got context {context}, batch "
                         f"{batch}, steps {steps}, budget {budget}, warm {warm}")
    waiting = [context] * batch
    computed = [0] * batch

    def step() -> None:
        left = budget
        for i in range(batch):
            if not waiting[i]:
                computed[i] += 1
                left -= 1
        for i in range(batch):
            if waiting[i] and left > 0:
                take = min(waiting[i], left)
                waiting[i] -= take
                computed[i] += take
                left -= take

    while any(waiting):
        step()
    for _ in range(warm):
        step()
    before = sum(computed)
    for _ in range(steps):
        step()
    return (before + sum(computed)) / 2 / batch


def decode_context(context: int, batch: int, steps: int, budget: int) -> int:
    """The context (tokens before the query) of a step model's decode batch standing for
    these timed steps: their mean, rounded."""
    return round(mean_context(context, batch, steps, budget))
