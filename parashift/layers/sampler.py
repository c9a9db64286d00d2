"""Batched sampling: logit bias and penalties, structured output's token masks, greedy,
temperature, top-k, top-p, min-p, per-request seeds, logprobs."""
import math
from dataclasses import dataclass

import torch

from parashift.kernels import use_triton
from parashift.layers.penalties import TokenHistory, apply_logits_processors
from parashift.sampling_params import SamplingParams
from parashift.structured.bitmask import apply_token_masks
from parashift.uploads import upload


def position_seed(seed: int, position: int) -> int:
    """The seed of a seeded request's draw at `position` (splitmix64 of both): a request's
    tokens are a function of its seed and positions only."""
    x = (seed * 0x9E3779B97F4A7C15 + position + 1) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (x ^ (x >> 31)) >> 1  # manual_seed takes up to 2**63 - 1


@dataclass
class SamplerOutput:
    token_ids: torch.Tensor  # [B] int64, on the logits' device
    # Per row: the top-k (k = params.logprobs) raw-model logprobs plus the sampled
    # token's, sampled token first; None for rows that did not ask. None if no row asked.
    logprobs: list[dict[int, float] | None] | None


@dataclass
class _RowParams:
    """Per-row sampling options as [B] tensors; `None` when no row in the batch uses one."""
    temperature: torch.Tensor
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None
    min_p: torch.Tensor | None


class Sampler:

    def __init__(self, device: torch.device | str, seed: int = 0):
        self.device = torch.device(device)
        self.generator = self.make_generator(seed, self.device)  # for rows without a seed

    @staticmethod
    def make_generator(seed: int, device: torch.device | str) -> torch.Generator:
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
        return generator

    def __call__(self, logits: torch.Tensor, params: list[SamplingParams],
                 generators: list[torch.Generator | None],
                 shared: torch.Generator | None = None,
                 with_logprobs: bool = True, history: TokenHistory | None = None,
                 token_masks: list | None = None) -> SamplerOutput:
        """`shared`: the generator of rows without one (default: this sampler's).
        `with_logprobs=False` skips the logprobs (and their host sync) even where asked.
        `history` holds the tokens of the rows with penalties; `token_masks[i]`: row i's
        structured-output bitmask, or None."""
        assert logits.dim() == 2 and logits.shape[0] == len(params) == len(generators)
        raw = logits.float()
        logits = apply_logits_processors(raw, params, history)
        if token_masks is not None:  # in place: the raw logits stay for the logprobs
            logits = apply_token_masks(logits.clone() if logits is raw else logits, token_masks)
        token_ids = logits.argmax(dim=-1)
        if not all(p.greedy for p in params):
            sampled = self._sample(logits, params, generators, shared or self.generator)
            greedy = upload([p.greedy for p in params], torch.bool, logits.device)
            token_ids = torch.where(greedy, token_ids, sampled)
        logprobs = _gather_logprobs(raw, params, token_ids) if with_logprobs else None
        return SamplerOutput(token_ids, logprobs)

    def warm_up(self, vocab_size: int, dtype: torch.dtype) -> None:
        """Compiles the argmax-only path's kernel (CUDA) before any request waits for it."""
        if self.device.type == "cuda":
            self.argmax(torch.zeros(1, vocab_size, dtype=dtype, device=self.device))

    @staticmethod
    def argmax(logits: torch.Tensor) -> SamplerOutput:
        """What __call__ returns for rows that are all `argmax_only` (SamplingParams): the
        argmax of the raw logits, no logprobs."""
        if use_triton(logits):  # torch's runs a row on one block (kernels/argmax.py)
            from parashift.kernels import argmax
            if argmax.enabled():
                return SamplerOutput(argmax.argmax(logits), None)
        return SamplerOutput(cpu_friendly(logits).argmax(dim=-1), None)  # exact in any float dtype

    def _sample(self, logits: torch.Tensor, params: list[SamplingParams],
                generators: list[torch.Generator | None], shared: torch.Generator) -> torch.Tensor:
        rows = _row_params(params, logits.shape[1], logits.device)
        logits = logits / rows.temperature.unsqueeze(1)
        logits = _apply_filters(logits, rows)
        probs = logits.softmax(dim=-1)
        noise = _exponential_noise(probs, params, generators, shared)
        # Exponential race: argmax(p_i / E_i) with E_i ~ Exp(1) is distributed as p.
        return probs.div_(noise).argmax(dim=-1)


def _exponential_noise(probs: torch.Tensor, params: list[SamplingParams],
                       generators: list[torch.Generator | None],
                       shared: torch.Generator) -> torch.Tensor:
    seeded = [row for row, (p, g) in enumerate(zip(params, generators))
              if g is not None and not p.greedy]
    if len(seeded) + sum(p.greedy for p in params) < len(params):
        noise = torch.empty_like(probs).exponential_(generator=shared)
    else:  # no unseeded row samples: leave the shared generator's stream alone
        noise = torch.ones_like(probs)
    for row in seeded:
        noise[row].exponential_(generator=generators[row])
    # Exp(1) draws of exactly 0 would turn masked tokens' 0 / 0 into NaN.
    return noise.clamp_(min=torch.finfo(noise.dtype).tiny)


def cpu_friendly(logits: torch.Tensor) -> torch.Tensor:
    """The logits in float32 on the CPU, where a bf16 argmax is a scalar loop (4x the time
    of a float32 one over SmolLM2's 49,152 columns); the same values, so the same argmax."""
    if logits.device.type == "cpu" and logits.dtype != torch.float32:
        return logits.float()
    return logits


def _row_params(params: list[SamplingParams], vocab_size: int, device: torch.device) -> _RowParams:
    """Greedy rows get neutral values: their sampled token is discarded anyway."""
    def tensor(values, dtype):
        return upload(values, dtype, device)

    sampled = [p for p in params if not p.greedy]
    temperature = [1.0 if p.greedy else p.temperature for p in params]
    top_k = [vocab_size if p.greedy or p.top_k == -1 else min(p.top_k, vocab_size) for p in params]
    top_p = [1.0 if p.greedy else p.top_p for p in params]
    # log(min_p) bounds a token's logit relative to the best one; log(0) = -inf filters nothing.
    log_min_p = [-math.inf if p.greedy or p.min_p == 0 else math.log(p.min_p) for p in params]
    return _RowParams(
        temperature=tensor(temperature, torch.float32),
        top_k=tensor(top_k, torch.int64) if any(k < vocab_size for k in top_k) else None,
        top_p=tensor(top_p, torch.float32) if any(p.top_p < 1.0 for p in sampled) else None,
        min_p=tensor(log_min_p, torch.float32) if any(p.min_p > 0 for p in sampled) else None,
    )


def _apply_filters(logits: torch.Tensor, rows: _RowParams) -> torch.Tensor:
    """Sets the logits of tokens that top-k, top-p or min-p exclude to -inf. The mask is
    built in sorted order but applied in vocabulary order, so a row's probabilities do
    not depend on which other rows share the batch."""
    if rows.top_k is None and rows.top_p is None:
        if rows.min_p is not None:
            best = logits.amax(dim=-1, keepdim=True)
            logits = logits.masked_fill(logits < best + rows.min_p.unsqueeze(1), -math.inf)
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    excluded = _sorted_exclusion_mask(sorted_logits, rows)
    return logits.masked_fill(excluded.scatter(1, order, excluded), -math.inf)


def _sorted_exclusion_mask(sorted_logits: torch.Tensor, rows: _RowParams) -> torch.Tensor:
    """For logits sorted descending: True where a token is filtered out. Top-k and min-p
    first (min-p's ratio to the best token does not change under them), then top-p
    on what is left."""
    excluded = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if rows.top_k is not None:
        rank = torch.arange(sorted_logits.shape[1], device=sorted_logits.device)
        excluded |= rank.unsqueeze(0) >= rows.top_k.unsqueeze(1)
    if rows.min_p is not None:
        excluded |= sorted_logits < sorted_logits[:, :1] + rows.min_p.unsqueeze(1)
    if rows.top_p is not None:
        probs = sorted_logits.masked_fill(excluded, -math.inf).softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        # top_p == 1 rows are left alone: rounding can push the cumulative sum past 1.
        keep_all = (rows.top_p >= 1.0).unsqueeze(1)
        excluded |= (mass_before >= rows.top_p.unsqueeze(1)) & ~keep_all
    return excluded


def _gather_logprobs(logits: torch.Tensor, params: list[SamplingParams],
                     token_ids: torch.Tensor) -> list[dict[int, float] | None] | None:
    """Logprobs of the unprocessed model distribution, for the rows that asked."""
    rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    if not rows:
        return None
    index = upload(rows, torch.int64, logits.device)
    logprobs = logits.index_select(0, index).log_softmax(dim=-1)
    sampled_ids = token_ids.index_select(0, index)
    sampled_lp = logprobs.gather(1, sampled_ids.unsqueeze(1)).squeeze(1)
    k = min(max(params[i].logprobs for i in rows), logits.shape[1])
    top_lp, top_ids = logprobs.topk(k, dim=-1)
    sampled_ids, sampled_lp = sampled_ids.tolist(), sampled_lp.tolist()
    top_ids, top_lp = top_ids.tolist(), top_lp.tolist()
    out: list[dict[int, float] | None] = [None] * len(params)
    for j, i in enumerate(rows):
        entry = {sampled_ids[j]: sampled_lp[j]}
        n = params[i].logprobs
        entry.update(zip(top_ids[j][:n], top_lp[j][:n]))
        out[i] = entry
    return out
