"""Which replica takes a new request, and how long a context each layout holds.

A request needs room for its prompt and every token it may generate (prompt + max_tokens,
or max_model_len without max_tokens). It goes to a replica whose group holds that; among
those, a request more urgent than the default (priority < 0: vLLM's order, lower is more
urgent) goes to the widest group (the TP group it binds: the flying policy merges one for
it) and any other to the least-loaded replica. A request no group of the layout holds but
a layout of some width would waits, unplaced, until the policy has merged such a group;
one no layout holds is refused at submission."""
from dataclasses import dataclass

from parashift.kv.views import tokens_per_block
from parashift.parallel.plan import Plan

DEFAULT_PRIORITY = 0


@dataclass(frozen=True)
class Slot:
    """What routing reads of one replica."""
    load: int      # its running and waiting requests
    group: int     # its group in the node layout
    width: int     # replicas its group merges (1: not merged)
    capacity: int  # tokens one request can hold there


def need(num_prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> int:
    """Tokens a request may come to hold."""
    if max_tokens is None:
        return max_model_len
    return min(num_prompt_tokens + max_tokens, max_model_len)


def route(slots: list[Slot], tokens: int, priority: int) -> int | None:
    """The index of the slot that takes a request needing `tokens`; None when none holds it."""
    fitting = [i for i, slot in enumerate(slots) if slot.capacity >= tokens]
    if not fitting:
        return None
    if priority < DEFAULT_PRIORITY:
        widest = max(slots[i].width for i in fitting)
        return min((i for i in fitting if slots[i].width == widest),
                   key=lambda i: (slots[i].group, slots[i].load))
    return min(fitting, key=lambda i: slots[i].load)


def check_fits(tokens: int, num_prompt_tokens: int, max_context: dict[int, int],
               forced: int | None = None) -> None:
    """Refuses, naming its length and the largest capacity, a request that no layout the
    node may take holds (only the forced width's while an administrator forces one)."""
    allowed = {w: c for w, c in max_context.items() if forced is None or w == forced}
    largest = max(allowed.values(), default=0)
    if tokens > largest:
        where = f" at the forced width {forced}" if forced is not None else ""
        raise ValueError(f"the request needs {tokens} tokens of context ({num_prompt_tokens} "
                         f"prompt tokens + max_tokens), more than the {largest} that the largest "
                         f"layout of this node holds{where}; shorten the prompt or max_tokens")


def group_capacity(plan: Plan, rank_blocks: list[int], loaded: dict[int, Plan], kv_heads: int,
                   block_size: int) -> int:
    """Tokens of KV a group running `plan` holds: its ranks' shared block count times the
    tokens per block of the plan's view of their pools."""
    blocks = min(rank_blocks[r] for r in plan.ranks)
    return blocks * tokens_per_block(plan, loaded[plan.ranks[0]], kv_heads, block_size)


def max_context_by_width(layouts: dict[int, tuple[str, ...]], plans: dict[str, Plan],
                         capacity) -> dict[int, int]:
    """For each width's layout, the most tokens one of its groups holds (`capacity(plan)`
    gives a group's)."""
    return {width: max(capacity(plans[name]) for name in names)
            for width, names in sorted(layouts.items())}
