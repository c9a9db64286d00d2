"""What a switch costs, in seconds, from the same profiles as a step: a merge or split
(Flying: drain the step in flight, compute moved requests' tokens again), a Seesaw
re-shard (the weight bytes a rank lacks under the new plan, from its peers or the host) and
KV move (out to the CPU tier and back in), a SiDP fetch (one FFN slice from its owner)."""
from parashift.cost.step import StepBatch, StepModel, replica_plan
from parashift.parallel.plan import Plan


def drain_s(model: StepModel, plan: Plan, running: int, context: int) -> float:
    """The step in flight finishes first: one decode step of the running batch."""
    if running < 1:
        return 0.0
    return model.step_s(replica_plan(plan), StepBatch.decode(running, context))


def recompute_s(model: StepModel, plan: Plan, tokens: int, budget: int = 16384) -> float:
    """Moved requests' tokens computed again under `plan`, in steps of the budget."""
    total = 0.0
    while tokens > 0:
        chunk = min(tokens, budget)
        total += model.step_s(replica_plan(plan), StepBatch.prefill(chunk))
        tokens -= chunk
    return total


def merge_cost_s(model: StepModel, source: Plan, target: Plan, running: int, context: int,
                 moved_tokens: int) -> float:
    """A merge or split: the source groups drain, then the moved tokens are recomputed
    under the target plan (zero where requests keep their KV)."""
    return drain_s(model, source, running, context) + recompute_s(model, target, moved_tokens)


def _shard(plan: Plan, rank: int, num_layers: int) -> tuple[range, float, float]:
    c = plan.coords(rank)
    return plan.stage_layers(num_layers, c.pp), c.tp / plan.tp, (c.tp + 1) / plan.tp


def missing_weight_bytes(shape, source: Plan, target: Plan) -> float:
    """The most bytes of its `target` shard one rank does not hold under `source` (`shape`:
    anything with num_layers and layer_bytes)."""
    s, layer_bytes = shape, shape.layer_bytes
    most = 0.0
    for rank in target.ranks:
        layers, low, high = _shard(target, rank, s.num_layers)
        held, held_low, held_high = _shard(source, rank, s.num_layers)
        overlap = max(0.0, min(high, held_high) - max(low, held_low))
        shared = len(set(layers) & set(held)) * overlap
        most = max(most, (len(layers) * (high - low) - shared) * layer_bytes)
    return most


def reshard_s(model: StepModel, source: Plan, target: Plan, from_peers: bool = True) -> float:
    """Seesaw's weight switch: the missing bytes over the peer copy rate (or the host's)."""
    nbytes = missing_weight_bytes(model.shape, source, target)
    if from_peers and model.link is not None:
        return model.link.seconds("peer_copy", nbytes, 2)
    return nbytes / model.compute.host_to_device_bytes_per_s


def kv_move_s(model: StepModel, tokens: int, ranks: int) -> float:
    """KV of `tokens` out of the old plan into the CPU tier and back into the new one, every
    rank its share at once."""
    if model.link is None:
        raise ValueError("a KV move through the CPU tier needs a link profile")
    nbytes = tokens * model.shape.kv_bytes_per_token / ranks
    return 2 * nbytes / model.link.kv_tier_bytes_per_s


def sidp_fetch_s(model: StepModel, tp: int, owners: int) -> float:
    """Weight-as-a-Service: one layer's FFN slice a rank fetches from its owner."""
    s = model.shape
    nbytes = s.mlp_params * s.linear_bytes / tp * (owners - 1) / owners
    return model.link.seconds("peer_copy", nbytes, 2)
