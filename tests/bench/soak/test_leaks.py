"""The soak's leak checks on made-up samples: a replacement keeps its slot, growth fails."""
from parashift.bench.soak.leaks import Slots, compare
from parashift.bench.soak.processes import ProcessSample


def proc(pid, role, start, rss=1000, fds=10, threads=4, state="S", ppid=1):
    return ProcessSample(pid, ppid, role, state, rss, fds, threads, start)


BASE = {1: proc(1, "front", 0), 2: proc(2, "forkserver", 1), 3: proc(3, "worker", 2),
        4: proc(4, "worker", 3)}


def test_slots_follow_a_replacement_and_mark_a_loss():
    slots = Slots(BASE)
    assert {name: slot.pid for name, slot in slots.slots.items()} == \
        {"worker0": 3, "worker1": 4, "front": 1, "forkserver": 2}
    assert slots.follow({1: BASE[1], 2: BASE[2], 3: BASE[3]}) == ["worker1: pid 4 gone"]
    assert slots.slots["worker1"].lost
    healed = {1: BASE[1], 2: BASE[2], 3: BASE[3], 9: proc(9, "worker", 50)}
    assert slots.follow(healed) == ["worker1: pid 4 replaced by 9"]
    assert not slots.slots["worker1"].lost and slots.slots["worker1"].pids == [4, 9]
    rows = compare(slots, BASE, healed, rss_tolerance=0.1)
    assert all(row.ok for row in rows)


def test_growth_fails_and_shrinking_does_not():
    slots = Slots(BASE)
    final = {1: proc(1, "front", 0, rss=1200), 2: proc(2, "forkserver", 1, fds=11),
             3: proc(3, "worker", 2, threads=5), 4: proc(4, "worker", 3, rss=500, fds=8)}
    problems = {row.slot: row.problems for row in compare(slots, BASE, final, 0.1)}
    assert problems == {"front": ["RSS +20.0% (limit +10%)"],
                        "forkserver": ["file descriptors 10 -> 11"],
                        "worker0": ["threads 4 -> 5"], "worker1": []}


def test_zombies_and_newcomers_are_problems():
    slots = Slots(BASE)
    final = {**BASE, 4: proc(4, "worker", 3, state="Z", fds=None), 7: proc(7, "python", 60)}
    rows = {row.slot: row for row in compare(slots, BASE, final, 0.1)}
    assert rows["worker1"].problems == ["zombie"]
    assert rows["new:python"].problems == ["started after the warm-up"]
