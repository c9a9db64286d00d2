"""Shift Parallelism's weights for the shift plan (TP over SP_TP): each rank's
shard is its SP rank's slice of its base (SP, TP) shard. `slice` keeps views of
the base weights (no extra memory); `separate` keeps contiguous copies (extra
memory w / (SP x TP) per rank, the paper's choice)."""
import logging

from torch import nn

logger = logging.getLogger(__name__)
SHIFT_WEIGHT_MODES = ("separate", "slice")
SHIFT_WEIGHTS = "shift"  # the layout key of the shift plan's weights


def make_shift_weights(model: nn.Module, sp_size: int, sp_rank: int, mode: str,
                       report: bool = True) -> int:
    """Gives every parallel linear layer its shift shard; returns the extra bytes."""
    if mode not in SHIFT_WEIGHT_MODES:
        raise ValueError(f"shift weights must be one of {SHIFT_WEIGHT_MODES}, got {mode!r}")
    extra = 0
    for module in model.modules():
        if hasattr(module, "make_shift_shard"):
            extra += module.make_shift_shard(sp_size, sp_rank, mode == "separate")
    base = sum(p.nbytes for p in model.parameters())
    if report:
        logger.warning("shift weights (%s): base shard %.2f GiB, shift shard adds %.2f GiB per rank",
                       mode, base / 2**30, extra / 2**30)
    return extra
