"""A Seesaw run from the step model: prompts prefilled under the prefill plan in phases the
CPU KV tier bounds, each phase then decoded under the decode plan, with a switch (weight
re-shard, KV through the tier) each way."""
from parashift.cost.runs import Engine, Served, offline_s
from parashift.cost.step import StepModel
from parashift.cost.switch import kv_move_s, reshard_s
from parashift.parallel.plan import Plan


def seesaw_s(model: StepModel, prefill: Plan, decode: Plan, requests: list[tuple[int, int]],
             tier_bytes: float, engine: Engine = Engine(), from_peers: bool = True,
             starts_in_decode: bool = False) -> tuple[float, dict]:
    """(seconds, parts): the phases' prefill, decode and switch time; `from_peers`: the
    weights a switch needs come from the peers (the link's peer copies), else from the
    pinned host copies; `starts_in_decode`: the group is in its decode plan when the run
    starts (a run after another on one engine, as benchmarks/seesaw.py repeats them), so
    the first phase switches to the prefill plan first."""
    per_token = model.shape.kv_bytes_per_token
    phase_tokens = tier_bytes / per_token  # the group's one tier (engine/seesaw.py make_tiers)
    phases, current, tokens = [], [], 0
    for req in requests:
        if current and tokens + req[0] > phase_tokens:
            phases.append(current)
            current, tokens = [], 0
        current.append(req)
        tokens += req[0]
    phases.append(current)
    parts = {"prefill": 0.0, "decode": 0.0,
             "switch": reshard_s(model, decode, prefill, from_peers) if starts_in_decode else 0.0}
    for k, phase in enumerate(phases):
        prompts = [(i, 1) for i, _ in phase]  # (counts one decode step: the first token)
        parts["prefill"] += offline_s(model, Served(prefill, stage_replicas=False), prompts,
                                      engine)  # Seesaw's group serves one replica
        parts["decode"] += offline_s(model, Served(decode), [(i, o) for i, o in phase], engine) \
            - offline_s(model, Served(decode), [(i, 1) for i, _ in phase], engine)
        moved = sum(i for i, _ in phase)
        parts["switch"] += reshard_s(model, prefill, decode, from_peers) + kv_move_s(
            model, moved, prefill.world_size)
        if k < len(phases) - 1:
            parts["switch"] += reshard_s(model, decode, prefill, from_peers)
    return sum(parts.values()), parts

