"""Prompt contents for benchmark requests, from the seed.

Token-id prompts (the default, for /v1/completions) have exactly the requested
length on any server that accepts token ids. Text prompts (needed for chat)
are random common words, about one token each; their exact token count
depends on the tokenizer, and the server's `usage` reports the true count."""
import numpy as np

from parashift.bench.workloads import BenchRequest

WORDS = ("time year people way day man thing woman life child world school state family "
         "student group country problem hand part place case week company system program "
         "question work government number night point home water room mother area money "
         "story fact month lot right study book eye job word business issue side kind head "
         "house service friend father power hour game line end member law car city name "
         "team minute idea kid body information back parent face others level office door "
         "health person art war history party result change morning reason research girl "
         "guy moment air teacher force education").split()


def fill_token_prompts(requests: list[BenchRequest], seed: int, vocab_size: int,
                       low: int = 100) -> None:
    """Random ids in [low, vocab_size): no two prompts share a prefix by chance."""
    if vocab_size <= low:
        low = 0
    rng = np.random.default_rng([seed, 2])
    for request in requests:
        request.prompt = rng.integers(low, vocab_size, size=request.input_len).tolist()


def fill_text_prompts(requests: list[BenchRequest], seed: int) -> None:
    rng = np.random.default_rng([seed, 3])
    for request in requests:
        picks = rng.integers(0, len(WORDS), size=request.input_len)
        request.prompt = " ".join(WORDS[i] for i in picks)


REPEAT_INSTRUCTION = "Repeat the following Python code exactly as it is, with nothing else:\n\n"
_FUNCTION = """def {name}(values, {arg}):
    total = {start}
    for value in values:
        if value > {limit}:
            total += value * {arg}
        else:
            total -= {limit}
    return total

"""


def repeat_text(rng: np.random.Generator, num_tokens: int) -> str:
    """A code of about `num_tokens` tokens (~45 a function) to be repeated: functions named
    from common words."""
    functions = []
    for _ in range(max(1, num_tokens // 45)):
        first, second, arg = (WORDS[i] for i in rng.integers(0, len(WORDS), size=3))
        functions.append(_FUNCTION.format(name=f"{first}_{second}", arg=f"{arg}_rate",
                                          start=int(rng.integers(0, 100)),
                                          limit=int(rng.integers(1, 1000))))
    return REPEAT_INSTRUCTION + "".join(functions)


def fill_repeat_prompts(requests: list[BenchRequest], seed: int) -> None:
    """The `repeat` workload's text prompts (the server's chat template applies)."""
    rng = np.random.default_rng([seed, 4])
    for request in requests:
        request.prompt = repeat_text(rng, request.input_len)
