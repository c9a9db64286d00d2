"""Seesaw on the engine's side (the policy is engine/policy/seesaw.py): each group's CPU KV
tier (its buffer, created here and mapped by the group's ranks, and its slot accounting),
the gate its scheduler asks in each phase, and the moves of its requests' KV at a
transition.

Every request a seesaw group admits holds a tier slot of the most tokens it may reach
(prompt + max_tokens) from its admission to its end, so that at any transition the tier
can hold the KV of every request the group holds: the ranks of the old plan gather each
request's KV (its computed tokens) out of their pool into its slot, then the ranks of the
new plan scatter it into theirs. The two plans read one pool per rank in their own shapes
(worker/seesaw.py) with the same block ids, so the block tables stay as they are. In the
prefill phase the gate admits requests while the tier holds their slot and runs prompt
chunks only (a request whose prompt is done waits for the decode phase); in the decode
phase it admits no new request. The tier is empty once every request it held has ended:
the policy then prefills again."""
import time
from dataclasses import dataclass

from parashift.engine.sequence import Sequence
from parashift.kv.cpu_tier import CpuKVTier, TierShape
from parashift.kv.tier_allocator import TierAllocator
from parashift.parallel.plan import Plan

PHASES = ("prefill", "decode", "transition", "idle")


@dataclass(frozen=True)
class TierHandle:
    """What a rank needs to map a group's tier."""
    path: str
    shape: TierShape
    tokens: int


@dataclass(frozen=True)
class KVMove:
    """One request's KV at a transition: its pages, its computed tokens, its slot."""
    block_table: tuple[int, ...]
    num_tokens: int
    slot_start: int
    slot_length: int


class SeesawGate:
    """What a seesaw group's scheduler may admit and run in the group's phase."""

    def __init__(self, slots: TierAllocator, need):
        self.slots, self.need = slots, need  # need(seq): the tokens its slot holds
        self.prefill = True
        self.stalled = False  # its prefill phase scheduled nothing though prompts wait

    def admits(self, seq: Sequence) -> bool:
        """A request holding a slot (one preempted) anytime; a new one in the prefill phase
        when the tier holds its slot (which it takes)."""
        if seq.request_id in self.slots.slots:
            return True
        return self.prefill and self.slots.allocate(seq.request_id, self.need(seq)) is not None

    def runs(self, seq: Sequence) -> bool:
        """In the prefill phase a running request computes its prompt only."""
        return not self.prefill or seq.num_computed_tokens < seq.num_prompt_tokens

    def release(self, seq: Sequence) -> None:
        self.slots.free(seq.request_id)


class SeesawTier:
    """One seesaw group: its two plans, its tier and the gate of its scheduler."""

    def __init__(self, prefill: Plan, decode: Plan, shape: TierShape, tokens: int, need):
        self.prefill, self.decode = prefill, decode
        self.buffer = CpuKVTier.create(shape, tokens)
        self.slots = TierAllocator(tokens)
        self.gate = SeesawGate(self.slots, need)
        self.handle = TierHandle(self.buffer.path, shape, tokens)
        self.seconds = dict.fromkeys(PHASES, 0.0)  # since `since`; idle is the rest
        self.since = time.perf_counter()
        # requests whose KV the prefill phase wrote to the tier before the transition, with
        # (preemptions, computed tokens) then: still so at the transition, it moves in only
        self.stashed: dict[str, tuple[int, int]] = {}
        self.stashed_bytes = 0  # since the last move out
        self.stashed_tokens = 0  # since start-up

    def take_seconds(self) -> dict[str, float]:
        """Seconds in each phase since the last call; idle: the wall time the others leave."""
        now = time.perf_counter()
        seconds, self.seconds = self.seconds, dict.fromkeys(PHASES, 0.0)
        seconds["idle"] = max(0.0, now - self.since - sum(seconds.values()))
        self.since = now
        return seconds

    def enter(self, plan: Plan) -> str:
        """The group now runs `plan`; returns the phase's direction ("to_decode"/"to_prefill")."""
        self.gate.prefill, self.gate.stalled = plan == self.prefill, False
        return "to_prefill" if self.gate.prefill else "to_decode"

    def stashes(self, running: list[Sequence], scheduled: set[str]) -> list[tuple[Sequence, KVMove]]:
        """In the prefill phase, the running requests whose prompt is computed by a step
        already submitted (not in this one: `scheduled`) and not yet in the tier: the next
        step writes their KV to their slots beside its forward, off the transition."""
        if not self.gate.prefill:
            return []
        ready = []
        for seq in running:
            key = (seq.num_preemptions, seq.num_computed_tokens)
            if (seq.num_computed_tokens >= seq.num_prompt_tokens and not seq.num_pending_tokens
                    and seq.block_table and seq.request_id not in scheduled
                    and self.stashed.get(seq.request_id) != key):
                self.stashed[seq.request_id] = key
                self.stashed_bytes += seq.num_computed_tokens * self.handle.shape.token_bytes
                self.stashed_tokens += seq.num_computed_tokens
                ready.append((seq, self.moves([seq])[0]))
        return ready

    def to_move_out(self, seqs: list[Sequence]) -> list[Sequence]:
        """The requests whose KV the tier does not hold as it is now."""
        return [seq for seq in seqs if self.stashed.get(seq.request_id)
                != (seq.num_preemptions, seq.num_computed_tokens)]

    def take_stashed_bytes(self) -> int:
        """The bytes the prefill phase wrote before this move out (the phase's stash ends)."""
        moved, self.stashed_bytes, self.stashed = self.stashed_bytes, 0, {}
        return moved

    def moves(self, seqs: list[Sequence]) -> list[KVMove]:
        """The KV moves of the requests that hold pages (their computed tokens)."""
        moves = []
        for seq in seqs:
            if seq.num_computed_tokens and seq.block_table:
                slot = self.slots.slots[seq.request_id]
                moves.append(KVMove(tuple(seq.block_table), seq.num_computed_tokens,
                                    slot.start, slot.length))
        return moves

    def free_run(self, first_waiting: Sequence | None) -> int:
        """The room for the next prompt, as the policy reads it: none once a prefill phase
        is stalled (its pool or its seats are full), all of it for a request that holds its
        slot, else the tier's largest free range."""
        if self.gate.stalled:
            return 0
        if first_waiting is not None and first_waiting.request_id in self.slots.slots:
            return self.slots.capacity
        return self.slots.largest_free()

    def close(self) -> None:
        self.buffer.close()


def seesaw_stats(moving: list, outs: list[dict], ins: list[dict], stashed: int = 0) -> dict:
    """A seesaw transition's record fields from its ranks' move stats (none: no seesaw);
    `stashed`: the KV bytes its prefill phase wrote to the tier before it (moved out too)."""
    if not moving:
        return {}
    return dict(direction="to_prefill" if moving[0][1].gate.prefill else "to_decode",
                weight_bytes=sum(o["prefetch_bytes"] for o in outs)
                + sum(i["weight_bytes"] for i in ins),
                weight_peer_bytes=sum(o["prefetch_peer_bytes"] for o in outs)
                + sum(i["weight_peer_bytes"] for i in ins),
                weight_host_bytes=sum(o["prefetch_host_bytes"] for o in outs)
                + sum(i["weight_host_bytes"] for i in ins),
                weight_s=max(i["weight_s"] for i in ins),
                kv_bytes_out=sum(o["kv_bytes_out"] for o in outs) + stashed,
                kv_bytes_in=sum(i["kv_bytes_in"] for i in ins))


def make_tiers(config, layout, pairs, hf_config, dtype, need) -> dict[tuple[int, ...], SeesawTier]:
    """One tier per seesaw group, by its ranks (none without the seesaw policy)."""
    if config.parallel_policy != "seesaw":
        return {}
    shape = TierShape.of_model(hf_config, dtype)
    tokens = shape.tokens_for(config.seesaw.cpu_kv_tokens, config.seesaw.cpu_kv_gib)
    tiers = {}
    try:
        for plan, (prefill, decode) in zip(layout.plans, pairs):
            tiers[tuple(sorted(plan.ranks))] = SeesawTier(prefill, decode, shape, tokens, need)
    except BaseException:
        for tier in tiers.values():
            tier.close()
        raise
    return tiers
