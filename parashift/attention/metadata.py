"""Per-step attention metadata, built once per step by the model runner."""
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class AttentionMetadata:
    """Tokens of a step are flattened over sequences: sequence i owns rows
    query_start_loc[i]:query_start_loc[i+1] of q/k/v. Its context after this
    step is seq_lens[i] tokens, the last (q_len) of which are the new ones;
    token j of the context lives in slot block_tables[i][j // block_size] *
    block_size + j % block_size of the KV pool."""

    slot_mapping: torch.Tensor       # [num_tokens] int64; -1 = padding row, not written
    query_start_loc: torch.Tensor    # [num_seqs + 1] int32, on device
    seq_lens: torch.Tensor           # [num_seqs] int32, on device
    block_tables: torch.Tensor       # [num_seqs, max_blocks] int32, padded with 0
    query_start_loc_cpu: list[int]
    seq_lens_cpu: list[int]
    max_query_len: int
    max_seq_len: int
    block_size: int
    # CUDA-graph steps: the host lists describe the captured bucket (every sequence one
    # row), not the step; the device tensors hold the truth, padding rows included.
    static_shape: bool = False
    # the host's copy of block_tables where the step has one (eager steps; None otherwise)
    block_tables_cpu: np.ndarray | None = field(default=None, repr=False, compare=False)
    # what a backend derives from the step once and reuses in every layer (its own keys)
    derived: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)
