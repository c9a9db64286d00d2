"""Plans over rank subsets and node layouts, as values (no processes)."""
import pytest

from parashift.parallel.layout import Layout, describe_layout
from parashift.parallel.plan import Plan


def test_a_plan_over_a_rank_subset_maps_its_groups_to_those_ranks():
    plan = Plan.parse("sp2xtp2@4-7")
    assert plan.ranks == (4, 5, 6, 7)
    assert plan.groups("tp") == [(4, 5), (6, 7)] and plan.groups("sp") == [(4, 6), (5, 7)]
    assert plan.groups("sp_tp") == [(4, 6, 5, 7)]
    assert [plan.head_block(r) for r in plan.ranks] == [0, 2, 1, 3]
    shift = plan.shift_plan()
    assert shift.name() == "shift-tp4@4-7" and shift.groups("tp") == [(4, 6, 5, 7)]
    assert plan.output_rank() == 4
    with pytest.raises(ValueError, match="not one of plan"):
        plan.coords(0)


def test_plan_names_round_trip_and_default_ranks_have_one_spelling():
    for name in ("single", "tp2", "dp2xpp2xtp2", "tp2@2-3", "single@3", "tp2@0.2"):
        assert Plan.parse(name).name() == name
    assert Plan(tp=2).on((0, 1)) == Plan(tp=2)
    assert Plan.parse("tp2@0.2").groups("tp") == [(0, 2)]
    with pytest.raises(ValueError, match="cannot read plan"):
        Plan.parse("tq2")
    with pytest.raises(ValueError, match="distinct ranks"):
        Plan(tp=2, rank_set=(1, 1))


def test_a_static_plan_is_one_group_per_dp_replica():
    layout = Layout.of(Plan(dp=2, pp=2, tp=2))
    assert layout.name() == "pp2xtp2,pp2xtp2@4-7"
    assert [p.groups("pp") for p in layout.plans] == [[(0, 2), (1, 3)], [(4, 6), (5, 7)]]
    assert [layout.group_of_rank(r) for r in range(8)] == [0] * 4 + [1] * 4
    assert [p.output_rank() for p in layout.plans] == [2, 6]


def test_a_layout_of_different_plans():
    layout = Layout.parse("tp2,single,single")
    assert layout.world_size == 4 and layout.name() == "tp2,single@2,single@3"
    assert [layout.group_of_rank(r) for r in range(4)] == [0, 0, 1, 2]
    text = describe_layout(layout, num_layers=2, num_heads=4, num_kv_heads=2)
    assert "group 1: plan single@2" in text and "rank 3:" in text


@pytest.mark.parametrize("plans, message", [
    ((Plan(tp=2), Plan(tp=2)), "once each"),
    ((Plan(tp=2).on((1, 2)),), "once each"),
    ((Plan(dp=2),), "dp = 1"),
])
def test_a_layout_partitions_the_node(plans, message):
    with pytest.raises(ValueError, match=message):
        Layout(plans)


def test_layout_groups_take_no_ranks_or_dp():
    with pytest.raises(ValueError, match="without ranks or dp"):
        Layout.parse("tp2@2-3")


def test_replicas_merge_into_one_tp_group_over_their_dp_tp_ranks():
    merged = Plan.merged([Plan(tp=2), Plan(tp=2).on((2, 3))])
    assert merged.name() == "merge2-tp4" and Plan.parse("merge2-tp4") == merged
    # each rank's merged shard is half its replica's shard: TP position tp_rank * w + replica
    assert merged.groups("tp") == [(0, 2, 1, 3)]
    assert merged.vocab_group_of(1) == (0, 1)  # the vocabulary stays split as it was loaded
    assert [merged.narrowing(r) for r in range(4)] == [(2, 0), (2, 0), (2, 1), (2, 1)]
    assert [merged.head_block(r) for r in range(4)] == [0, 2, 1, 3]
    assert merged.loaded_plan(3) == Plan(tp=2).on((2, 3))
    assert merged.split() == [Plan(tp=2), Plan(tp=2).on((2, 3))]
    assert merged.output_rank() == 0
    four = Plan.parse("merge4-tp4@4-7")
    assert four.groups("tp") == [(4, 5, 6, 7)] and four.loaded_plan(6) == Plan.parse("single@6")
    with pytest.raises(ValueError, match="only two or more replicas"):
        Plan.merged([Plan(tp=2), Plan(sp=2).on((2, 3))])
    with pytest.raises(ValueError, match="multiple of it"):
        Plan.parse("merge2-tp3")


def test_a_merge_and_a_split_replace_groups_by_plans_over_the_same_ranks():
    layout = Layout.parse("single,single,tp2")
    merged = layout.replace((0, 1), (Plan.parse("merge2-tp2"),))
    assert merged.name() == "merge2-tp2,tp2@2-3"
    split = merged.replace((0,), (Plan.parse("single@1"), Plan.parse("single")))
    assert split.name() == layout.name()  # groups in the order of their first rank
    with pytest.raises(ValueError, match="do not cover exactly"):
        layout.replace((0,), (Plan.parse("merge2-tp2"),))


def test_a_layout_without_a_lost_rank_drops_that_rank_s_whole_group():
    layout = Layout.parse("tp2,tp2,single")
    narrower = layout.without({1})
    assert [plan.name() for plan in narrower.plans] == ["tp2@2-3", "single@4"]
    assert narrower.lost == (0, 1) and narrower.world_size == 5
    assert narrower.group_of_rank(4) == 1
    with pytest.raises(ValueError, match="outside"):
        narrower.group_of_rank(0)
    assert narrower.without({4}).lost == (0, 1, 4)
    merged = Layout.parse("single,single,single").without({0})
    assert merged.replace((0, 1), (Plan.parse("merge2-tp2@1-2"),)).lost == (0,)
    assert narrower.without({2, 4}).plans == () and narrower.without(set()) == narrower
    with pytest.raises(ValueError, match="lost ranks"):
        Layout((Plan(tp=2),), lost=(1,))


def test_replicas_sharing_ffn_weights():
    """SiDP: each replica's plan names its mode and every sharing rank; a rank's FFN slice
    sits at position tp_rank * d + replica of the TP = d*tp shard."""
    from parashift.parallel.layout import coupled_groups
    layout = Layout.of(Plan(dp=2, tp=2)).sharing_ffn("cas")
    assert layout.name() == "tp2+cas/0-3,tp2@2-3+cas/0-3"
    second = layout.plans[1]
    assert Plan.parse(second.name()) == second
    assert second.ffn_replicas == 2 and second.ffn_shard_ranks() == (0, 2, 1, 3)
    assert second.group_of("ffn", 3) == (1, 3) and second.groups("ffn") == [(0, 2), (1, 3)]
    assert coupled_groups(list(layout.plans)) == [(0, 1)]
    was = [p.sharing_ffn("was", p.shared_ffn[1]) for p in layout.plans]
    assert coupled_groups(was) == []
    with pytest.raises(ValueError, match="only some of the replicas"):
        coupled_groups([layout.plans[0], was[1]])
    with pytest.raises(ValueError, match="two or more replicas of its size"):
        Plan(tp=2, rank_set=(1, 2)).sharing_ffn("cas", (0, 1, 2, 3))
    with pytest.raises(ValueError, match="plain TP"):
        Plan(pp=2).sharing_ffn("was", (0, 1, 2, 3))
    with pytest.raises(ValueError, match="cannot be split into 4 owned slices"):
        second.check_model(8, 4, 2, intermediate_size=6)
