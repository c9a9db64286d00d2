"""Seesaw on one rank: the prefill plan's and the decode plan's models (their parameters
in one weight arena, parallel/seesaw_weights.py), each reading the rank's one KV pool in
its own shape ([its layers, blocks, block_size, its KV heads, head_dim], the same block
ids), and the moves of a group's KV through the CPU tier at a transition: `move_out`
gathers every moving request's slice out of the running plan's view of the pool into the
tier (and prefetches the new plan's weights that the running plan does not use);
`move_in`, once every rank of the group has moved out, scatters the new plan's slices
from the tier into its view and activates its weights."""
import contextlib
import time

import torch

from parashift.kv.cache import KVCache, attention_layers
from parashift.kv.cpu_tier import CpuKVTier, TierMappings, TierShape
from parashift.kv.tier_allocator import TierSlot
from parashift.kv.tier_copy import gather, rank_kv_slice, scatter, wait_for_copies
from parashift.parallel.arena_layout import place
from parashift.parallel.host_copy import HostCopy
from parashift.parallel.seesaw_weights import PeerGroup, WeightArena
from parashift.parallel.weight_staging import release, stage
from parashift.parallel.state import ParallelState
from parashift.worker.peer_weights import peer_group
from parashift.worker.rank_hooks import RankHooks, RankSetup
from parashift.startup_phases import StartupPhases


def pool_views(pool: torch.Tensor, shapes: dict[str, tuple[int, int]], block_size: int,
               head_dim: int) -> tuple[dict[str, torch.Tensor], int]:
    """Each plan's view of one pool tensor, [layers, blocks, block_size, heads, head_dim]
    over its first bytes, with the most blocks every plan's view holds (`shapes`: plan ->
    (layers, heads)); returns the views and that block count."""
    flat = pool.view(-1)
    per_block = {name: layers * block_size * heads * head_dim
                 for name, (layers, heads) in shapes.items()}
    blocks = min(flat.numel() // n for n in per_block.values())
    views = {name: flat[:blocks * per_block[name]].view(layers, blocks, block_size, heads, head_dim)
             for name, (layers, heads) in shapes.items()}
    return views, blocks


def rank_hooks_for(setup: RankSetup) -> "SeesawRank | None":
    """This rank under both seesaw plans: the running one's model, and the other's (the one
    other plan over the same ranks) built and loaded; a switch re-shards from the group's
    ranks where `setup.group` (given where the rank asks for the peer path:
    peer_weights.asks_peer_path) can carry it."""
    config, state = setup.config, setup.state
    if config.parallel_policy != "seesaw":
        return None
    others = [s for s in setup.other_states if sorted(s.plan.ranks) == sorted(state.plan.ranks)]
    if len(others) != 1:
        raise ValueError(f"a seesaw rank runs two plans over its group's ranks, got "
                         f"{[state.plan.name(), *(s.plan.name() for s in others)]}")
    # the peer path moves checkpoint pieces, and FP8 weights' scales are none (made at load,
    # or spread per tensor): FP8 weights move from the host copies, scales with them
    fp8 = any(p.dtype == torch.float8_e4m3fn for p in setup.model.parameters())
    with setup.phases.phase("seesaw peer group"):
        peers = None if setup.group is None or fp8 else peer_group(
            setup.group, setup.device, setup.hf_config, setup.source,
            [state.plan, others[0].plan], setup.dtype, setup.max_model_len,
            config.moe_parallel, asked=config.seesaw.weight_source == "peers")
    # the running model leaves the device before the other is built: never both on it.
    # Where `loads_into_arena`, its loader writes it into the arena anew (not FP8: scales
    # are made at load), and only what switches read is copied out after
    resident = config.seesaw.resident_weights
    name = state.plan.name()
    reload = {} if fp8 or setup.reload_weights is None or not loads_into_arena(setup.device) \
        else {name: lambda: setup.reload_weights(setup.model)}
    with setup.phases.phase("seesaw running model off the device"):
        if reload:
            release(setup.model)
        staged = {} if reload else {name: stage(
            setup.model, place(setup.model),
            pin=setup.device.type == "cuda" and peers is None and not resident)}
    with setup.phases.phase("seesaw other plan's model build and load"):
        other = setup.build_model(others[0])
    return SeesawRank({name: setup.model, others[0].plan.name(): other},
                      {name: state, others[0].plan.name(): others[0]},
                      setup.hf_config.num_hidden_layers, setup.hf_config.num_key_value_heads,
                      setup.device, resident, peers, staged, reload, setup.phases)


def loads_into_arena(device: torch.device) -> bool:
    """Whether the running plan's weights are loaded again into the arena rather than
    staged through the host: on a GPU (its shard would cross PCIe twice through pageable
    memory), not on a CPU (a copy costs less than a second load)."""
    return device.type == "cuda"


class SeesawRank(RankHooks):
    # each plan's model reads its own view of the pool, bound for good; the decode plan
    # replays graphs, the prefill plan's stages run eagerly
    kv_views_per_plan = True
    graphs_for_some_plans = True
    mixed_step_graphs = False

    def __init__(self, models: dict[str, torch.nn.Module], states: dict[str, ParallelState],
                 num_layers: int, num_kv_heads: int, device: torch.device,
                 resident_weights: bool = False, peers: PeerGroup | None = None,
                 staged: dict[str, HostCopy] | None = None, reload: dict | None = None,
                 phases: StartupPhases | None = None):
        """`models` and `states`: the prefill plan's first (the running one), by plan name;
        `resident_weights`: both plans' shards stay on the device (no weight copies);
        `peers`: a switch fills the new shard from the group's ranks (parallel/
        seesaw_weights.py), not only from the pinned host copies; `staged`: the models
        already moved out of device memory (parallel/weight_staging.py); `reload`: the
        plans whose loader fills the arena instead (`WeightArena`)."""
        self.models, self.states, self.device = models, states, device
        self.slices = {name: rank_kv_slice(s.plan, s.rank, num_layers, num_kv_heads)
                       for name, s in states.items()}
        self.arena = WeightArena(models, device, resident=resident_weights, peers=peers,
                                 staged=staged, reload=reload, phases=phases)
        self.active = next(iter(models))
        self.views: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.num_blocks = 0
        self.tiers = TierMappings(device)
        # the prefill phase's KV writes to the tier run beside the step's forward; the next
        # step (or a move) waits for them before any page is reused
        self.stash_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._stashing = False

    @property
    def pinned_bytes(self) -> int:
        return self.arena.pinned_bytes

    def bind_kv(self, kv: KVCache) -> None:
        """Points each plan's attention layers at its view of the pool, for good."""
        shapes = {name: (len(s.layers), len(s.heads)) for name, s in self.slices.items()}
        block_size, head_dim = kv.k.shape[2], kv.k.shape[-1]
        k, self.num_blocks = pool_views(kv.k, shapes, block_size, head_dim)
        v, _ = pool_views(kv.v, shapes, block_size, head_dim)
        for name, model in self.models.items():
            self.views[name] = (k[name], v[name])
            for i, layer in enumerate(attention_layers(model)):
                layer.k_cache, layer.v_cache = k[name][i], v[name][i]

    def stash(self, batch, shape: TierShape) -> int:
        """Writes the step's swaps out (the requests whose prompt the prefill phase
        computed in earlier steps) from the running plan's view of the pool into their tier
        slots, on a copy stream the step's forward does not wait for; returns the bytes."""
        self._join_stash()
        if not batch.swap_out:
            return 0
        with torch.inference_mode(False):  # the mapping outlives the step (moves run outside it)
            tier = self.tiers.get(batch.swap_tier_path, shape, batch.swap_tier_tokens)
        (k, v), kv_slice = self.views[self.active], self.slices[self.active]
        stream = self.stash_stream
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(self.device))  # the KV is written
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            moved = sum(gather(k, v, swap.block_ids, swap.num_tokens, kv_slice, tier,
                               TierSlot(swap.slot_start, swap.slot_length))
                        for swap in batch.swap_out)
        self._stashing = stream is not None
        return moved

    def _join_stash(self) -> None:
        if self._stashing:
            torch.cuda.current_stream(self.device).wait_stream(self.stash_stream)
            self._stashing = False

    def move_out(self, target: str, moves: list, handle) -> dict:
        """Gathers the moving requests' KV of the running plan into the tier (the prefill
        phase's stashes done first), then prefetches what of `target`'s weights the running
        plan does not use."""
        self._join_stash()
        start = time.perf_counter()
        tier, (k, v), kv_slice = self._tier(handle), self.views[self.active], self.slices[self.active]
        kv_bytes = sum(gather(k, v, list(m.block_table), m.num_tokens, kv_slice, tier,
                              TierSlot(m.slot_start, m.slot_length)) for m in moves)
        wait_for_copies(self.device)  # the other plan's ranks read these slots next
        prefetched = self.arena.prefetch(target)
        return {"kv_bytes_out": kv_bytes, "prefetch_bytes": prefetched.bytes,
                "prefetch_peer_bytes": prefetched.peer_bytes,
                "prefetch_host_bytes": prefetched.host_bytes, "out_s": time.perf_counter() - start}

    def move_in(self, target: str, moves: list, handle) -> dict:
        """Scatters the moving requests' KV from the tier into `target`'s view of the pool
        and makes `target` the running plan (its weights activated)."""
        start = time.perf_counter()
        tier, (k, v), kv_slice = self._tier(handle), self.views[target], self.slices[target]
        kv_bytes = sum(scatter(tier, TierSlot(m.slot_start, m.slot_length), m.num_tokens,
                               kv_slice, k, v, list(m.block_table)) for m in moves)
        wait_for_copies(self.device)  # the engine frees these slots next
        switch = self.arena.activate(target)
        self.active = target
        return {"kv_bytes_in": kv_bytes, "weight_bytes": switch.bytes,
                "weight_peer_bytes": switch.peer_bytes, "weight_host_bytes": switch.host_bytes,
                "weight_s": switch.seconds, "in_s": time.perf_counter() - start}

    def _tier(self, handle) -> CpuKVTier:
        return self.tiers.get(handle.path, handle.shape, handle.tokens)

    # ---- the rank hooks (worker/rank_hooks.py) ----------------------------------
    def model_for(self, plan_name: str) -> torch.nn.Module | None:
        return self.models.get(plan_name)

    def running_model(self) -> torch.nn.Module:
        return self.models[self.active]

    @staticmethod
    def replays_graphs(plan) -> bool:
        """Not a prefill plan's stages: their weights leave the device while the decode
        plan runs."""
        return plan.state.pp.size == 1

    def take_swaps(self, batch, swap_shape) -> bool:
        """A prefill phase's finished prompts' KV to the tier."""
        self.stash(batch, swap_shape)
        return True

    def move(self, verb: str, plan_name: str, moves: list, tier) -> dict:
        """"out" gathers the moving requests' KV into the tier; "in" scatters it into
        `plan_name`'s view of the pool and makes that plan's model the running one."""
        if verb == "out":
            return self.move_out(plan_name, moves, tier)
        if verb != "in":
            raise ValueError(f"unknown seesaw move {verb!r}")
        return self.move_in(plan_name, moves, tier)
