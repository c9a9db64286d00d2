"""`transitions.check` on made-up layouts: a merge makes one group of each two or more of
its groups (several disjoint merges at once included), and anything else is refused, named."""
import pytest

from parashift.engine.policy import Transition
from parashift.engine.transitions import check
from parashift.parallel.layout import Layout
from parashift.parallel.plan import Plan

REPLICAS = Layout.of(Plan(dp=4))
MADE = {p.name(): p for p in [*REPLICAS.plans, Plan.merged(list(REPLICAS.plans[:2])),
                               Plan.merged(list(REPLICAS.plans[2:])),
                               Plan.merged(list(REPLICAS.plans))]}


def test_disjoint_merges_at_once():
    both = Transition("merge", (0, 1, 2, 3), ("merge2-tp2", "merge2-tp2@2-3"))
    assert check(both, REPLICAS, MADE).name() == "merge2-tp2,merge2-tp2@2-3"
    one = Transition("merge", (2, 3), ("merge2-tp2@2-3",))
    assert check(one, REPLICAS, MADE).name() == "single,single@1,merge2-tp2@2-3"


@pytest.mark.parametrize("groups,target", [
    ((0,), ("single",)),                                 # a merge of one group
    ((0, 1, 2), ("merge2-tp2", "single@2")),             # a target that merges nothing
])
def test_a_merge_that_merges_no_two_groups_is_refused(groups, target):
    with pytest.raises(ValueError, match="cannot end in"):
        check(Transition("merge", groups, target), REPLICAS, MADE)


def test_targets_must_cover_the_groups_ranks():
    short = Transition("merge", (0, 1, 2), ("merge2-tp2",))  # group 2 left out
    with pytest.raises(ValueError, match="do not cover exactly the ranks"):
        check(short, REPLICAS, MADE)
