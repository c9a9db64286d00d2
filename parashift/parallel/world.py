"""This process's torch world: the node's ranks it was made of, in order. At start-up it
is every rank of the node (node rank = torch rank); a group of replaced ranks meets in a
world of its own (executor/replacement.py), where node rank r is torch rank
`members.index(r)`. Only the calls that name torch's world ranks translate (new_group,
point-to-point peers); a process group's own order is the same in both."""
_members: tuple[int, ...] | None = None  # None: node rank = torch rank


def set_world_ranks(members: tuple[int, ...]) -> None:
    global _members
    _members = None if members == tuple(range(len(members))) else tuple(members)


def world_ranks(ranks) -> list[int]:
    """The torch world ranks of node `ranks`."""
    return list(ranks) if _members is None else [_members.index(r) for r in ranks]


def world_rank(rank: int) -> int:
    return rank if _members is None else _members.index(rank)
