"""Deterministic mode (`--deterministic`): a request's tokens and logprobs do not depend on
what it is batched with, on the plan that runs it, or on a switch between plans.

Two rules make that hold:
- batch invariance: every kernel computes one row with one fixed reduction order, whatever
  the number of rows, the CUDA-graph bucket or the other requests of the step
  (`matmul.py`, `triton_matmul.py`, `elementwise.py`, the invariant attention backends);
- plan invariance: every contraction a plan splits has one canonical order. The K dimension
  of a row-parallel projection is cut into `reduction_chunks(hf_config)` chunks (a multiple
  of every TP degree up to MAX_TP the model allows); each chunk's partial is computed the
  same way on every plan, and the partials are summed in chunk order within two halves,
  then the halves' sums (`reduction.py`): a TP rank's share of a half is summed where it is
  computed and the shares are gathered instead of all-reduced. Heads (SP, TP) and layers (PP) are split without
  any reduction across ranks, so batch invariance covers them.

Layers learn the mode when they are built (`StepContext.reduction_chunks`); the default
mode's code paths are untouched."""
