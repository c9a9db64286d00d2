"""The ranks' side of structured output: the engine's token bitmasks applied to a
step's logits on the device (disallowed tokens -> -inf, before sampling or argmax)."""
import numpy as np
import torch


def apply_token_masks(logits: torch.Tensor, masks: list[np.ndarray | None]) -> torch.Tensor:
    """`masks[i]` is row i's bitmask (int32 words, as xgrammar packs them), None for a row
    without a constraint. Masks `logits` in place (a float32 copy of the model's) and
    returns it."""
    rows = [i for i, mask in enumerate(masks) if mask is not None]
    if not rows:
        return logits
    import xgrammar as xgr
    width = len(masks[rows[0]])
    bitmask = np.full((len(masks), width), -1, dtype=np.int32)  # -1: every token allowed
    bitmask[rows] = np.stack([masks[i] for i in rows])
    device_mask = torch.from_numpy(bitmask).to(logits.device, non_blocking=True)
    xgr.apply_token_bitmask_inplace(logits, device_mask, vocab_size=logits.shape[1],
                                    indices=rows)
    return logits
