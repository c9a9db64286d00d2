"""Node ranks to torch world ranks (parallel/world.py): the identity at start-up; in a
world of replaced ranks, each one's position among them."""
import pytest

from parashift.parallel import world


@pytest.fixture(autouse=True)
def restore():
    yield
    world.set_world_ranks((0,))


def test_the_start_up_world_is_the_identity():
    world.set_world_ranks((0, 1, 2, 3))
    assert world.world_ranks((2, 3)) == [2, 3] and world.world_rank(3) == 3


def test_a_replaced_group_numbers_its_ranks_from_0():
    world.set_world_ranks((2, 3))
    assert world.world_ranks((2, 3)) == [0, 1] and world.world_rank(3) == 1
    with pytest.raises(ValueError):
        world.world_rank(0)  # not in this world
