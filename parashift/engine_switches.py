"""Environment switches of the engine's kernels and graphs, read once here so that the
engine and the cost model that prices its steps (cost/step.py) read the same values; no
torch, so the planner imports it without a GPU stack."""
import os


def switch(name: str, default: str) -> bool:
    """A 0/1 switch read now (callers read theirs at build, capture or each call): 1 on, 0
    off, anything else an error naming it."""
    flag = os.environ.get(name, default)
    if flag not in ("0", "1"):
        raise ValueError(f"{name}={flag!r}: expected 0 or 1")
    return flag == "1"


# a model's q/k norms (Qwen3) inside the RoPE + KV-write kernel (layers/attention.py)
FUSED_QK_NORM = switch("PARASHIFT_FUSED_QK_NORM", "1")
# a MoE router of one row in one launch: gate GEMV, softmax, top-k (kernels/moe_router.py)
FUSED_ROUTER = switch("PARASHIFT_FUSED_ROUTER", "1")
# the most sequences a mixed CUDA graph holds, and the wide buckets' (0: none;
# worker/cuda_graphs.py)
MIXED_GRAPH_SEQS = int(os.environ.get("PARASHIFT_MIXED_GRAPH_SEQS", "64"))
MIXED_GRAPH_WIDE_SEQS = int(os.environ.get("PARASHIFT_MIXED_GRAPH_WIDE_SEQS", "0"))
