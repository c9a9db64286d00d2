"""The one context object that layers read: the active plan's groups on this rank, which
of the rank's weight layouts the plan uses, and the step's attention metadata.

The model runner sets it around every forward (and around building the model, under the
base plan, with no attention metadata); nothing else in the process holds plan state."""
from contextlib import contextmanager
from dataclasses import dataclass, replace

from parashift.attention.backend import AttentionBackend
from parashift.attention.metadata import AttentionMetadata
from parashift.parallel.state import GroupHandle, ParallelState

BASE_WEIGHTS = "base"  # the layout the rank loaded: its shard under the base plan


@dataclass(frozen=True)
class StepContext:
    state: ParallelState
    weights: str = BASE_WEIGHTS  # key of each layer's weight layout for this plan
    attn: AttentionMetadata | None = None
    backend: AttentionBackend | None = None
    # Deterministic mode's K chunks of row-parallel projections (parashift/deterministic/);
    # None: the default kernels. Read by layers when they are built.
    reduction_chunks: int | None = None
    # How mixture-of-experts layers split their experts: "tp" | "ep" (layers/fused_moe.py).
    # Read by layers when they are built.
    moe_parallel: str = "tp"
    # FP8 weights (parashift/quantization/scheme.py's WeightQuant), None: the model's dtype.
    # Read by layers when they are built.
    quantization: object | None = None
    kv_fp8: bool = False  # the KV pool is FP8: attention layers take its scales at load

    @property
    def tp(self) -> GroupHandle:
        return self.state.tp

    @property
    def sp(self) -> GroupHandle:
        return self.state.sp

    @property
    def vocab(self) -> GroupHandle:
        return self.state.vocab


_context = StepContext(ParallelState.single())


def get_context() -> StepContext:
    return _context


def get_attention_context() -> StepContext:
    """The context of a forward step (one with attention metadata)."""
    if _context.attn is None:
        raise RuntimeError("no step context: layers run attention only inside a model runner step")
    return _context


@contextmanager
def use_context(ctx: StepContext):
    """Makes `ctx` the active context for the duration."""
    global _context
    saved, _context = _context, ctx
    try:
        yield ctx
    finally:
        _context = saved


def ffn_sharding():
    """A context whose TP group is the one the FFN weights are sharded over while layers
    are built: the TP group, or SiDP's owned slices (ParallelState.ffn_shard)."""
    ctx = _context
    if ctx.state.ffn_shard is None:
        return use_context(ctx)
    return use_context(replace(ctx, state=replace(ctx.state, tp=ctx.state.ffn_shard)))


def use_state(state: ParallelState, weights: str = BASE_WEIGHTS,
              reduction_chunks: int | None = None, moe_parallel: str = "tp",
              quantization=None, kv_fp8: bool = False):
    """A context with `state`'s groups and no step (building a model, loading weights)."""
    return use_context(StepContext(state, weights, reduction_chunks=reduction_chunks,
                                   moe_parallel=moe_parallel, quantization=quantization,
                                   kv_fp8=kv_fp8))
