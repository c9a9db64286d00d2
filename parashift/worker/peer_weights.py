"""What Seesaw's peer re-shard needs to know of its group, on every rank alike: every
rank's arena under both plans (parallel/arena_layout.py) and the checkpoint boxes each
parameter holds (loader/weight_pieces.py), from models built on the meta device (their
structure, no bytes) for each (plan, rank); and whether the peer path may run at all."""
import logging

import torch
import torch.distributed as dist
from torch import nn

from parashift.context import use_state
from parashift.loader.weight_pieces import (checkpoint_shapes, config_checkpoint_shapes,
                                            parameter_pieces)
from parashift.models.registry import model_class_for
from parashift.parallel.arena_layout import place, region_offsets
from parashift.parallel.plan import Plan
from parashift.parallel.reshard_schedule import RankWeights
from parashift.parallel.seesaw_weights import PeerGroup
from parashift.parallel.state import GroupHandle, ParallelState

logger = logging.getLogger(__name__)
STAGING_BYTES = 64 * 2**20  # per rank and direction: a round's staged sends, its receives


def structure(hf_config, plan: Plan, rank: int, dtype: torch.dtype, max_model_len: int,
              moe_parallel: str = "tp") -> nn.Module:
    """`rank`'s model under `plan` on the meta device: its parameters' names, shapes,
    dtypes and loaders, no storage."""
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with use_state(ParallelState.unconnected(plan, rank), moe_parallel=moe_parallel), \
                torch.device("meta"):
            return model_class_for(hf_config)(hf_config, max_model_len)
    finally:
        torch.set_default_dtype(saved)


def group_weights(hf_config, shapes: dict[str, tuple[int, ...]], plans: list[Plan],
                  dtype: torch.dtype, max_model_len: int,
                  moe_parallel: str = "tp") -> dict[int, RankWeights]:
    """Every rank's arena (its least size: the larger plan's bytes) under the two seesaw
    `plans` (over the same ranks, the first at the arena's start)."""
    out = {}
    for rank in sorted(plans[0].ranks):
        layouts, pieces = {}, {}
        for plan in plans:
            model = structure(hf_config, plan, rank, dtype, max_model_len, moe_parallel)
            layouts[plan.name()] = place(model)
            pieces[plan.name()] = parameter_pieces(model, shapes)
        sizes = [layout.size for layout in layouts.values()]
        out[rank] = RankWeights(layouts, dict(zip(layouts, region_offsets(sizes, max(sizes)))),
                                pieces)
    return out


def holds_checkpoint_slices(source) -> bool:
    """Whether a peer's shard can fill this rank's: every plan's parameters are slices of
    the same checkpoint tensors (a safetensors checkpoint), or random weights (for speed
    runs only: each plan draws its own, and the running plan's draw then stands for the
    checkpoint a switch re-shards, the other plan's layers clear of the running plan's
    region keeping theirs; so a rank need not pin both plans' shards). GGUF tensors are
    transformed on load."""
    return source.kind in ("hf", "random")


def asks_peer_path(config, device: torch.device, source) -> bool:
    """Whether a seesaw rank asks its group for the peer path: asked for ("peers"), or by
    default ("auto") on GPUs where `holds_checkpoint_slices` and every seesaw group sits in
    one host, NCCL_P2P_DISABLE=1 included (NCCL then moves the bytes through host shared
    memory; the host copies shrink to what no rank holds all the same); never with both
    plans resident (no weights move). Every rank decides alike: the groups are made
    together."""
    wanted = config.seesaw.weight_source
    if config.seesaw.resident_weights or wanted == "host":
        return False
    if wanted == "peers":
        return True
    return device.type == "cuda" and holds_checkpoint_slices(source) and all(
        config.topology.within_host(plan.ranks) for plan in config.node_layout.plans)


def peer_weights_usable(group, device: torch.device, source) -> bool:
    """Whether this rank can take the peer path: `holds_checkpoint_slices`, on a GPU (NCCL)
    or a CPU (gloo, for tests). CUDA peer access is not asked for: the transfers are NCCL
    sends and receives, which cross NVLink or PCIe P2P where they may and otherwise go
    through host shared memory (NCCL_P2P_DISABLE=1, GPUs without peer access), still
    without a host copy's pinned bytes. The caller agrees with the group on it."""
    if group is None or not holds_checkpoint_slices(source):
        return False
    return device.type in ("cuda", "cpu")


def agree(group, device: torch.device, usable: bool) -> bool:
    """True only where every rank of `group` says `usable`."""
    flag = torch.tensor([int(usable)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def load_group_weights(hf_config, source, plans: list[Plan], dtype: torch.dtype,
                       max_model_len: int,
                       moe_parallel: str = "tp") -> dict[int, RankWeights] | None:
    """`group_weights` from the checkpoint's shapes (random weights: those of the config's
    checkpoint); None (and a warning) where a loader does what the weight probes cannot
    follow."""
    try:
        shapes = (config_checkpoint_shapes(hf_config) if source.kind == "random"
                  else checkpoint_shapes(source.path))
        return group_weights(hf_config, shapes, plans, dtype, max_model_len, moe_parallel)
    except (ValueError, TypeError, IndexError, KeyError, NotImplementedError) as e:
        logger.warning("seesaw weights re-shard from the pinned host copies only: %s", e)
        return None


def peer_group(group: GroupHandle, device: torch.device, hf_config, source, plans: list[Plan],
               dtype: torch.dtype, max_model_len: int, moe_parallel: str = "tp",
               staging_bytes: int = STAGING_BYTES, asked: bool = True) -> PeerGroup | None:
    """The peer path of this rank's seesaw group (`group`, over both `plans`' ranks) where
    every rank of it can take the path (they agree), else None: host copies only (a
    warning where the path was `asked` for, not just the default)."""
    if group.size == 1:
        return None
    weights = (load_group_weights(hf_config, source, plans, dtype, max_model_len, moe_parallel)
               if holds_checkpoint_slices(source) else None)
    usable = weights is not None and peer_weights_usable(group.group, device, source)
    # the group's first collective (NCCL's point-to-point batches need one before them)
    if not agree(group.group, device, usable):
        if group.rank == 0:
            log = logger.warning if asked else logger.info
            log("seesaw group %s re-shards its weights from the pinned host copies (not "
                "every rank can take the peer path)", list(group.ranks))
        return None
    return PeerGroup(group.group, group.ranks[group.rank], weights, staging_bytes)
