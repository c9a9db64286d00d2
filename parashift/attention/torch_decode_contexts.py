"""The CPU backend's decode contexts held from one step to the next.

A decode step of the torch backend reads each sequence's whole context out of the paged pool
(two gathers a layer: every key and value of the batch copied, each step). Where a step's
sequences are the last step's, in the same rows, each one token longer, this keeps every
layer's padded contexts ([seqs, capacity, kv_heads, d], the layout the gathers make) and
writes only the step's new keys and values into them, beside the pool's own write. bf16 and
fp16 pools only (`holds`).

Held contexts are used only where nothing but the chain of decode steps can have written
their slots: the step right after the one they were synced at (every step of the runner
counts, whatever it holds), the same number of sequences, each one token longer, and the
same blocks under each sequence's held positions. Anything else regathers from the pool; past
MAX_HELD_BYTES over all layers a layer gathers each step as before.
Positions a sequence has not reached are zeros (or its first slot's rows, as the gathers pad),
so a masked-out position is never NaN: the softmax gives it exactly 0 and the output is the gathers' bits."""
from dataclasses import dataclass

import torch

from parashift.attention.metadata import AttentionMetadata

MAX_HELD_BYTES = 256 * 2**20  # all layers' held keys and values (a quarter of the CPU's
# default pool); a layer that would pass it gathers as before
CAPACITY_STEP = 64  # positions added to a held buffer at a time


def holds(cache: torch.Tensor) -> bool:
    """Whether a pool's decode contexts are held: bf16 / fp16 only. On the Intel host, bf16
    at batch 16 ran 1.052x with them (7 interleaved rounds); fp32 0.908x and 0.938x (3 and 2
    rounds): SDPA then reads twice the bytes from memory that the gathers had left in cache
    (docs/benchmark_log.md). FP8 pools are read through a cast, never held; nor is a CUDA
    pool (the torch backend there is a reference)."""
    return cache.element_size() == 2 and cache.device.type == "cpu"


@dataclass
class HeldStep:
    """The step a layer's contexts were last synced at."""
    number: int
    lens: list[int]
    tables: torch.Tensor  # [seqs, blocks] of that step


@dataclass
class HeldContexts:
    k: torch.Tensor  # [seqs, capacity, kv_heads, d]
    v: torch.Tensor
    step: HeldStep


class DecodeContexts:
    """A runner's held decode contexts, one entry a layer (by its key pool's address)."""

    def __init__(self):
        self.held: dict[int, HeldContexts] = {}
        self.steps = 0

    def step_of(self, meta: AttentionMetadata) -> HeldStep:
        """This step's number (counted at its first layer) and the batch it holds."""
        if "held_step" not in meta.derived:
            self.steps += 1
            # copies: the runner may refill its step buffers in place
            meta.derived["held_step"] = HeldStep(self.steps, list(meta.seq_lens_cpu),
                                                 meta.block_tables.clone())
        return meta.derived["held_step"]

    def write(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
              meta: AttentionMetadata) -> None:
        """Beside the pool's write of a step's new rows: the same rows into the layer's held
        contexts where this step continues them; else they are dropped."""
        step = self.step_of(meta)
        held = self.held.pop(k_cache.data_ptr(), None)
        if held is None or k.shape[0] != len(step.lens) or not continues(held.step, step, meta):
            return
        if max(step.lens) > held.k.shape[1]:
            growth = (capacity_for(max(step.lens)) - held.k.shape[1]) * held.k[:, 0].nbytes * 2
            if self.held_bytes() + held_bytes(held) + growth > MAX_HELD_BYTES:
                return
            held.k, held.v = (grown(t, max(step.lens)) for t in (held.k, held.v))
        rows = new_rows(meta, step, held.k.shape[1])
        for new, buf in ((k, held.k), (v, held.v)):
            buf.view(-1, *buf.shape[2:]).index_copy_(0, rows, new)
        held.step = step
        self.held[k_cache.data_ptr()] = held

    def contexts(self, k_cache: torch.Tensor, v_cache: torch.Tensor, key_slots: torch.Tensor,
                 meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor] | None:
        """([seqs, kv_heads, context_len, d] keys, values) of a decode step: held, or
        gathered from the pool into a new held buffer; None where holding it would pass
        MAX_HELD_BYTES (the caller gathers)."""
        step = self.step_of(meta)
        context_len = key_slots.shape[0] // len(step.lens)
        held = self.held.get(k_cache.data_ptr())
        if held is None or held.step is not step:
            self.held.pop(k_cache.data_ptr(), None)
            need = 2 * len(step.lens) * capacity_for(context_len) * k_cache[0, 0].nbytes
            if self.held_bytes() + need > MAX_HELD_BYTES:
                return None
            held = self.held[k_cache.data_ptr()] = gathered(k_cache, v_cache, key_slots, step,
                                                            context_len)
        return held.k[:, :context_len].transpose(1, 2), held.v[:, :context_len].transpose(1, 2)

    def held_bytes(self) -> int:
        return sum(held_bytes(held) for held in self.held.values())


def held_bytes(held: HeldContexts) -> int:
    return held.k.nbytes + held.v.nbytes


def capacity_for(length: int) -> int:
    return -(-length // CAPACITY_STEP) * CAPACITY_STEP


def gathered(k_cache, v_cache, key_slots, step: HeldStep, context_len: int) -> HeldContexts:
    seqs, row_shape = len(step.lens), k_cache.shape[2:]
    capacity = capacity_for(context_len)
    bufs = []
    for cache in (k_cache, v_cache):
        buf = torch.empty(seqs, capacity, *row_shape, dtype=cache.dtype, device=cache.device)
        buf[:, context_len:] = 0  # not reached yet: finite where the mask hides them
        rows = cache.view(-1, *row_shape).index_select(0, key_slots)
        buf[:, :context_len] = rows.view(seqs, context_len, *row_shape)
        bufs.append(buf)
    return HeldContexts(*bufs, step)


def grown(buf: torch.Tensor, length: int) -> torch.Tensor:
    out = buf.new_zeros(buf.shape[0], capacity_for(length), *buf.shape[2:])
    out[:, :buf.shape[1]] = buf
    return out


def continues(before: HeldStep, step: HeldStep, meta: AttentionMetadata) -> bool:
    """Whether `step` is the step right after `before`, its sequences one token longer on
    the same blocks (decided once a step for all the layers held at `before`)."""
    key = ("held_continues", before.number)
    if key not in meta.derived:
        meta.derived[key] = _continues(before, step, meta.block_size)
    return meta.derived[key]


def _continues(before: HeldStep, step: HeldStep, block_size: int) -> bool:
    if step.number != before.number + 1 or len(step.lens) != len(before.lens):
        return False
    if any(now != then + 1 for then, now in zip(before.lens, step.lens)):
        return False
    width = before.tables.shape[1]
    if step.tables.shape[1] < width:
        return False
    blocks = torch.tensor([-(-n // block_size) for n in before.lens])
    held_blocks = torch.arange(width)[None, :] < blocks[:, None]
    return torch.equal(before.tables.cpu().masked_fill(~held_blocks, 0),
                       step.tables[:, :width].cpu().masked_fill(~held_blocks, 0))


def new_rows(meta: AttentionMetadata, step: HeldStep, capacity: int) -> torch.Tensor:
    """Rows of a held [seqs * capacity] buffer the step's new tokens go to."""
    key = ("held_rows", capacity)
    if key not in meta.derived:
        last = torch.tensor(step.lens) - 1
        meta.derived[key] = torch.arange(len(step.lens)) * capacity + last
    return meta.derived[key]
