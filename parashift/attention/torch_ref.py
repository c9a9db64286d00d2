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
            k = k.repeat_interleave(group, dim=1).transpose(0, 1).to(q.dtype)
            v = v.repeat_interleave(group, dim=1).transpose(0, 1).to(q.dtype)
            q_len = qe - qs
            # query j sits at position seq_len - q_len + j and sees positions <= it
            pos_q = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
            mask = torch.arange(seq_len, device=q.device)[None, :] <= pos_q
            o = F.scaled_dot_product_attention(q[qs:qe].transpose(0, 1), k, v,
                                               attn_mask=mask, scale=scale)
            out[qs:qe] = o.transpose(0, 1)
        return out
