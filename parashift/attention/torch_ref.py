"""Reference attention in plain PyTorch: correct on any device, not fast."""
import torch
import torch.nn.functional as F

from parashift.attention.metadata import AttentionMetadata


def write_kv_slots(k, v, k_cache, v_cache, slot_mapping):
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    k_cache.view(-1, *k_cache.shape[2:])[slots] = k[valid].to(k_cache.dtype)
    v_cache.view(-1, *v_cache.shape[2:])[slots] = v[valid].to(v_cache.dtype)


def gather_context(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """[seq_len, num_kv_heads, head_dim] of one sequence from the paged pool."""
    block_size = cache.shape[1]
    num_blocks = (seq_len + block_size - 1) // block_size
    return cache[block_table[:num_blocks].long()].flatten(0, 1)[:seq_len]


class TorchAttentionBackend:
    name = "torch"

    def write_kv(self, k, v, k_cache, v_cache, meta: AttentionMetadata) -> None:
        write_kv_slots(k, v, k_cache, v_cache, meta.slot_mapping)

    def attend(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        out = torch.zeros_like(q)
        group = q.shape[1] // k_cache.shape[2]
        starts = meta.query_start_loc_cpu
        for i, seq_len in enumerate(meta.seq_lens_cpu):
            qs, qe = starts[i], starts[i + 1]
            if qe == qs:
                continue
            k = gather_context(k_cache, meta.block_tables[i], seq_len)
            v = gather_context(v_cache, meta.block_tables[i], seq_len)
            k = k.repeat_interleave(group, dim=1).transpose(0, 1)
            v = v.repeat_interleave(group, dim=1).transpose(0, 1)
            out[qs:qe] = self.attend_sequence(q[qs:qe], k, v, scale)
        return out

    def attend_sequence(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        scale: float) -> torch.Tensor:
        """q [q_len, heads, d]: the last q_len positions of the context k, v
        [heads, seq_len, d] -> [q_len, heads, d]."""
        q_len, seq_len = q.shape[0], k.shape[1]
        # query j sits at position seq_len - q_len + j and sees positions <= it
        pos_q = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
        mask = torch.arange(seq_len, device=q.device)[None, :] <= pos_q
        o = F.scaled_dot_product_attention(q.transpose(0, 1), k.to(q.dtype), v.to(q.dtype),
                                           attn_mask=mask, scale=scale)
        return o.transpose(0, 1)
