"""RoPE (with a model's q/k norms), the KV write and the attention of one layer's step on
CUDA: the backend's `rotate_and_attend` where it has one (the Triton backend's: in one launch
for decodes of many splits, triton_decode_preload.py), else kernels/rotary.py's kernel and
then the backend's `attend`."""
import torch

from parashift.attention.metadata import AttentionMetadata
from parashift.kernels import rotary


def rotate_write_attend(backend, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                        v: torch.Tensor, cos_sin: torch.Tensor, k_cache: torch.Tensor,
                        v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                        norms: tuple | None = None) -> torch.Tensor:
    """q [T, Hq, D], k and v [T, Hk, D] before RoPE; norms: (q norm weight, k norm weight,
    eps) or None. Writes k (rotated) and v to their slots, returns the attention output."""
    fused = getattr(backend, "rotate_and_attend", None)
    if fused is not None:
        return fused(positions, q, k, v, cos_sin, k_cache, v_cache, meta, scale, norms)
    q = rotary.rotate_and_write_kv(positions, q, k, v, cos_sin, k_cache, v_cache,
                                   meta.slot_mapping, norms)
    return backend.attend(q, k_cache, v_cache, meta, scale)
