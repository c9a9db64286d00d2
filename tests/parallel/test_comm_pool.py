"""The order in which ranks rendezvous their groups' symmetric memory: torch counts a
process's rendezvous across all its groups, so each group must sit at one position on all
of its ranks, or its ranks wait on each other forever (SiDP at DP=2 x TP=2 hung so on four
GPUs)."""
import random

from parashift.parallel.comm_pool import rendezvous_order


def positions_agree(order):
    seen = {}
    for group in order:
        assert len({seen.get(r, 0) for r in group}) == 1, (group, seen)
        for r in group:
            seen[r] = seen.get(r, 0) + 1


def test_tp_pairs_then_peer_pairs_are_reordered():
    """DP=2 x TP=2 with shared FFN weights creates (0,1), (0,2), (1,3), (2,3): in that
    order rank 0 meets (0,2) second and rank 2 first."""
    order, left_out = rendezvous_order([(0, 1), (0, 2), (1, 3), (2, 3)])
    assert order == [(0, 1), (2, 3), (0, 2), (1, 3)] and left_out == []
    positions_agree(order)


def test_a_group_of_every_rank_after_pairs():
    order, left_out = rendezvous_order([(0, 1), (0, 1, 2, 3), (2, 3), (0, 2), (1, 3)])
    assert order == [(0, 1), (2, 3), (0, 1, 2, 3), (0, 2), (1, 3)] and left_out == []


def test_single_rank_groups_need_no_rendezvous():
    assert rendezvous_order([(0,), (0, 1), (1,)]) == ([(0, 1)], [])


def test_a_triangle_leaves_one_group_out():
    """Three ranks, three pairs: no order puts every pair at one position on both ranks."""
    order, left_out = rendezvous_order([(0, 1), (0, 2), (1, 2)])
    assert order == [(0, 1)] and left_out == [(0, 2), (1, 2)]
    positions_agree(order)


def test_random_groups_always_agree():
    rng = random.Random(0)
    for _ in range(300):
        world = rng.randint(2, 8)
        groups = list(dict.fromkeys(tuple(sorted(rng.sample(range(world), rng.randint(2, world))))
                                    for _ in range(rng.randint(1, 10))))
        order, left_out = rendezvous_order(groups)
        positions_agree(order)
        assert sorted(order + left_out) == sorted(groups)


def test_groups_of_two_rendezvous_count_twice():
    """Deterministic mode rendezvouses a TP pair twice (the all-reduce's buffer, then the
    pair exchange's): DP=2 x TP=2 of (0,1), (2,3) and the rank pairs (0,2), (1,3) of FFN
    peers. (0,2) may follow (0,1) and (2,3) as before, since both pairs count two."""
    pairs = {(0, 1), (2, 3)}
    order, left_out = rendezvous_order([(0, 1), (0, 2), (1, 3), (2, 3)],
                                       lambda group: 2 if group in pairs else 1)
    assert order == [(0, 1), (2, 3), (0, 2), (1, 3)] and left_out == []
    # only (0, 1) counts twice: ranks 0 and 1 are then two rendezvous in, rank 2 one,
    # so (0, 2) and (1, 2) never line up
    order, left_out = rendezvous_order([(0, 1), (0, 2), (1, 2), (2, 3)],
                                       lambda group: 2 if group == (0, 1) else 1)
    assert order == [(0, 1), (2, 3)] and left_out == [(0, 2), (1, 2)]
