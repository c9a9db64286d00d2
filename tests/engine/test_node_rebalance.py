"""A group back in service takes its share of the waiting requests (engine/node_rebalance.py),
on the node over an executor whose replacements the test decides: -dp 2, rank 1 lost and
back; the requests it had and those that came meanwhile wait on rank 0."""
from parashift.engine.sequence import Sequence
from parashift.executor.replacement import Outcome
from parashift.kv.tier_allocator import TierAllocator
from tests.engine.test_node import _node, _place, _seq
from tests.engine.test_node_healing import lose_rank_1
from tests.engine.test_scheduler import step


def _loaded_node(tiny_llama_dir, count: int = 20):
    """-dp 2, max_num_seqs 4: `count` requests (every third more urgent, every fifth less),
    rank 0's first four running; then rank 1 is lost and its requests wait on rank 0."""
    node = _node(tiny_llama_dir, max_num_seqs=4)
    for i in range(count):
        seq = _seq(f"r{i}")
        seq.priority = -1 if i % 3 == 0 else 1 if i % 5 == 0 else 0
        _place(node, seq)
    step(node.replicas[0].scheduler)
    lose_rank_1(node)
    return node


def _come_back(node) -> None:
    node.executor.replaced.append(Outcome((1,), 0.5, blocks={1: 64}))
    node.take_losses()


def _ids(seqs) -> list[str]:
    return [seq.request_id for seq in seqs]


def test_the_returned_group_takes_the_head_of_the_queue_until_loads_are_even(tiny_llama_dir):
    node = _loaded_node(tiny_llama_dir)
    (survivor,) = node.replicas
    running, waiting = _ids(survivor.scheduler.running), survivor.scheduler.waiting
    assert (len(running), len(waiting)) == (4, 16)
    _come_back(node)
    back = node.replicas[1]
    assert (survivor.load, back.load) == (10, 10)  # 20 requests, shared by count
    assert _ids(back.scheduler.waiting) == _ids(waiting[:10])  # the queue's head, in order
    assert _ids(survivor.scheduler.waiting) == _ids(waiting[10:])
    assert _ids(survivor.scheduler.running) == running  # where their KV is
    assert max(s.priority for s in waiting[:10]) <= min(s.priority for s in waiting[10:])
    assert all(node.replica_of[i] is back for i in _ids(waiting[:10]))
    assert node.faults.requests_rebalanced == 10 == node.rebalancing.moved
    assert not node.rebalancing.receivers  # once
    every = [*_ids(survivor.scheduler.running), *_ids(survivor.scheduler.waiting),
             *_ids(back.scheduler.waiting)]
    assert sorted(every) == sorted(f"r{i}" for i in range(20))  # none lost, none twice


def test_running_requests_and_kv_in_a_tier_stay(tiny_llama_dir):
    """Only waiting requests without KV move: a swapped one keeps its tier slot on rank 0,
    and with only running ones left there nothing moves."""
    node = _loaded_node(tiny_llama_dir, count=8)
    (survivor,) = node.replicas
    survivor.scheduler.swap_slots = TierAllocator(64)
    swapped = survivor.scheduler.waiting[0]
    survivor.scheduler.swap_slots.allocate(swapped.request_id, 8)
    preempted = survivor.scheduler.waiting[1]
    survivor.encoder.sent_blocks[preempted.request_id] = 0  # its ranks were sent it
    _come_back(node)
    back = node.replicas[1]
    assert node.replica_of[swapped.request_id] is survivor
    assert (survivor.load, back.load) == (4 + 1, 3)  # three of the four waiting could move
    assert node.replica_of[preempted.request_id] is back
    assert preempted.request_id in survivor.encoder.finished  # its ranks forget it


def test_no_step_is_scheduled_until_none_is_in_flight(tiny_llama_dir):
    """Where the node does not re-form its world (this executor cannot), scheduling stops
    once the group is back, the steps in flight end, then the requests move."""
    node = _loaded_node(tiny_llama_dir)
    survivor = node.replicas[0]
    survivor.in_flight.append(("a step", "single", 0.0))
    _come_back(node)
    back = node.replicas[1]
    assert node.rebalancing.wanted and node._open_replicas() == []
    assert back.load == 0
    survivor.in_flight.clear()
    node.take_losses()
    assert back.load == 10 and not node.rebalancing.wanted
    assert node._open_replicas() == [survivor, back]


def test_a_request_the_returned_group_cannot_hold_stays(tiny_llama_dir):
    node = _loaded_node(tiny_llama_dir, count=6)
    (survivor,) = node.replicas
    longest = max(survivor.scheduler.waiting, key=Sequence.sort_key)  # the queue's tail
    longest.params.max_tokens = 10_000  # needs max_model_len
    node.executor.replaced.append(Outcome((1,), 0.5, blocks={1: 64}))
    node.healing.tick()
    node.replicas[1].scheduler.config.max_model_len = 128  # as if its pool held less
    node.take_losses()
    assert node.replica_of[longest.request_id] is survivor
