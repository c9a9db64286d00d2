"""The array cycle breaking (parallel/transfer_graph.py) against a plain reference of its
rule (components by mutual reachability; peel the member with the most in-component
reads, lowest index on a tie, until every component fits): the same components, the same
pieces moved to the host copy, on the tiny model's re-shards and on random graphs over
their transfers."""
import copy
import random
from dataclasses import replace

import pytest

import parashift.parallel.reshard_schedule as reshard_module
from parashift.parallel.reshard_schedule import reshard_schedule, staging_demand
from parashift.parallel.transfer_graph import break_cycles
from tests.parallel.test_reshard_schedule import tiny, weights_of  # noqa: F401 (fixture)

PAIRS = [("pp2", "tp2"), ("pp2xtp2", "tp4"), ("pp4", "pp2xtp2")]  # (prefill, decode)


def reachable(start, edges, inside):
    seen, stack = {start}, [start]
    while stack:
        for j in edges[stack.pop()]:
            if j in inside and j not in seen:
                seen.add(j)
                stack.append(j)
    return seen


def reference_components(nodes, edges):
    inside = set(nodes)
    reach = {i: reachable(i, edges, inside) for i in nodes}
    out, placed = [], set()
    for i in sorted(nodes):
        if i not in placed:
            component = sorted(j for j in reach[i] if i in reach[j])
            placed.update(component)
            out.append(component)
    return out


def reference_break_cycles(transfers, edges, staging_bytes, cycle):
    pending, done = reference_components(range(len(transfers)), edges), []
    while pending:
        component = pending.pop()
        send, recv = staging_demand([transfers[i] for i in component])
        if max([*send.values(), *recv.values(), 0]) <= staging_bytes:
            done.append(component)
            continue
        members = set(component)

        def waiting(i):
            return sum(j in members for j in edges[i])
        # a peer's read first (it crosses the receiver's link whether from the peer or the
        # host), the one the most writes wait on, the first on a tie
        victim = max(component, key=lambda i: (
            transfers[i].kind == "peer" and waiting(i) > 0, waiting(i), -i))
        t = transfers[victim]
        transfers[victim] = replace(t, src=None)
        cycle[t.dst.rank] += t.nbytes
        edges[victim] = []
        pending += reference_components(component, edges)
    return done


def same_as_reference(transfers, edges, staging_bytes):
    """Runs both on copies; returns the number of pieces moved to the host copy."""
    ranks = {t.dst.rank for t in transfers}
    want_t, want_e, want_c = list(transfers), copy.deepcopy(edges), dict.fromkeys(ranks, 0)
    got_t, got_e, got_c = list(transfers), copy.deepcopy(edges), dict.fromkeys(ranks, 0)
    want = reference_break_cycles(want_t, want_e, staging_bytes, want_c)
    got = break_cycles(got_t, got_e, staging_bytes, got_c)
    assert sorted(got) == sorted(want)
    assert got_t == want_t and got_e == want_e and got_c == want_c
    return sum(a is not b for a, b in zip(transfers, got_t))


@pytest.fixture(scope="module")
def calls(tiny):  # noqa: F811
    """(transfers, edges, staging) of every break_cycles call of the tiny model's switches."""
    seen = []

    def capture(transfers, edges, staging_bytes, cycle):
        seen.append((list(transfers), copy.deepcopy(edges), staging_bytes))
        return break_cycles(transfers, edges, staging_bytes, cycle)

    patch = pytest.MonkeyPatch()
    patch.setattr(reshard_module, "break_cycles", capture)
    try:
        for prefill, decode in PAIRS:
            ranks = weights_of(tiny, prefill, decode)
            for old, new in ((prefill, decode), (decode, prefill)):
                for staging in (2**30, 48 * 2**10, 12 * 2**10):
                    reshard_schedule(ranks, old, new, staging)
    finally:
        patch.undo()
    return seen


def test_schedules_break_the_same_cycles_as_the_reference(calls):
    moved = sum(same_as_reference(*call) for call in calls)
    assert moved > 0, "no switch here breaks a cycle: the comparison tests nothing"


@pytest.mark.parametrize("seed", range(12))
def test_random_graphs_break_the_same_cycles_as_the_reference(calls, seed):
    rng = random.Random(seed)
    transfers = max(calls, key=lambda call: len(call[0]))[0][:rng.randint(1, 120)]
    n, density = len(transfers), rng.choice([0.5, 2, 6])
    edges = {i: sorted({j for j in rng.choices(range(n), k=int(rng.random() * 2 * density))
                        if j != i}) for i in range(n)}
    largest = max(t.nbytes for t in transfers)
    staging = rng.choice([largest, 2 * largest, 5 * largest, largest // 2])
    same_as_reference(transfers, edges, staging)
