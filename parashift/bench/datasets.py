"""vLLM's `bench serve` datasets as workloads: `random` (token-id prompts of lengths drawn
around --random-input-len/--random-output-len) and `sharegpt` (the first human turn of each
ShareGPT conversation as the prompt, the reply's length as the output length). All requests
arrive at t=0 unless --request-rate says otherwise."""
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from parashift.bench.workloads import Dist, LengthClass, Workload

DATASETS = ("random", "sharegpt")
# ShareGPT conversations outside these token counts are skipped (vLLM's filter).
SHAREGPT_MIN_TOKENS, SHAREGPT_MAX_PROMPT, SHAREGPT_MAX_TOTAL = 4, 1024, 2048


@dataclass
class Dataset:
    """A workload and, for ShareGPT, the text of each of its prompts (by request index)."""
    workload: Workload
    prompts: list[str] | None = None

    def fill_prompts(self, requests) -> None:
        if self.prompts is not None:
            for request in requests:
                request.prompt = self.prompts[request.index % len(self.prompts)]


def random_dataset(num_prompts: int, input_len: int, output_len: int,
                   range_ratio: float = 0.0) -> Dataset:
    """Lengths uniform in [len * (1 - ratio), len * (1 + ratio)], as vLLM's random dataset."""
    if input_len < 1 or output_len < 1:
        raise ValueError("--random-input-len and --random-output-len must be >= 1")
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    lengths = [_around(n, range_ratio) for n in (input_len, output_len)]
    workload = Workload("random", num_prompts, (LengthClass(1.0, *lengths),), "t0",
                        f"random token ids: input {input_len}, output {output_len}, "
                        f"range ratio {range_ratio}")
    return Dataset(workload)


def _around(length: int, ratio: float) -> Dist:
    return Dist("uniform", max(1, int(length * (1 - ratio))), max(1, int(length * (1 + ratio))))


def sharegpt_dataset(path: str, num_prompts: int, seed: int, tokenizer,
                     output_len: int | None = None) -> Dataset:
    """`num_prompts` conversations of the ShareGPT JSON file, shuffled by `seed`; lengths
    counted with `tokenizer` (the served model's, for exact input lengths)."""
    conversations = _read_sharegpt(path)
    order = np.random.default_rng([seed, 4]).permutation(len(conversations))
    prompts, input_lens, output_lens = [], [], []
    for i in order:
        prompt, reply = conversations[i]
        n_in = len(tokenizer.encode(prompt))
        n_out = output_len or len(tokenizer.encode(reply))
        if n_in < SHAREGPT_MIN_TOKENS or n_out < SHAREGPT_MIN_TOKENS or \
                n_in > SHAREGPT_MAX_PROMPT or n_in + n_out > SHAREGPT_MAX_TOTAL:
            continue
        prompts.append(prompt)
        input_lens.append(n_in)
        output_lens.append(n_out)
        if len(prompts) == num_prompts:
            break
    if not prompts:
        raise ValueError(f"{path}: no conversation of {SHAREGPT_MIN_TOKENS} to "
                         f"{SHAREGPT_MAX_PROMPT} prompt tokens")
    lengths = (Dist("cycle", values=tuple(input_lens)), Dist("cycle", values=tuple(output_lens)))
    workload = Workload("sharegpt", len(prompts), (LengthClass(1.0, *lengths),), "t0",
                        f"ShareGPT conversations from {path}", ignore_eos=False)
    return Dataset(workload, prompts)


def _read_sharegpt(path: str) -> list[tuple[str, str]]:
    """(first human turn, the reply to it) of each conversation with at least two turns."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read the ShareGPT file {path}: {e}") from None
    if not isinstance(data, list):
        raise ValueError(f"{path} is not a ShareGPT file: expected a JSON list of "
                         "{\"conversations\": [...]} entries")
    pairs = []
    for entry in data:
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if isinstance(turns, list) and len(turns) >= 2 and \
                all(isinstance(t, dict) and isinstance(t.get("value"), str) for t in turns[:2]):
            pairs.append((turns[0]["value"], turns[1]["value"]))
    return pairs


def bench_tokenizer(name: str | None):
    """The tokenizer that counts ShareGPT lengths: a tokenizer directory, a .gguf file,
    or (None) the embedded SmolLM2's."""
    from parashift.loader.source import resolve_model
    from parashift.loader.tokenizer import load_tokenizer
    if name is None or name.endswith(".gguf"):
        return load_tokenizer(resolve_model(name))
    return load_tokenizer(None, name)
