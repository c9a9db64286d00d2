"""Self-healing on the node (engine/node_healing.py), over an executor whose replacements
the test decides: a lost group is asked for again, comes back with a new replica, and the
attempts are bounded and backed off."""
from parashift.executor.replacement import Outcome
from tests.engine.test_node import _node, _place, _seq


def lose_rank_1(node):
    node.executor.lose(1, "worker rank 1 died (killed by SIGKILL)")
    assert node.take_losses() == []
    assert node.executor.replacing == [(1,)]  # asked for at once
    assert node.faults.worker_restarts == 1 and node.faults.groups_serving == 1


def test_a_replaced_group_rejoins_the_layout_with_a_new_replica(tiny_llama_dir):
    node = _node(tiny_llama_dir)
    kept = _place(node, _seq("a"))
    lose_rank_1(node)
    node.executor.replaced.append(Outcome((1,), 0.5, blocks={1: 32}))
    node.take_losses()
    assert [p.ranks for p in node.layout.plans] == [(0,), (1,)] and not node.layout.lost
    assert [r.ranks for r in node.replicas] == [(0,), (1,)] and node.replicas[0] is kept
    assert node.replicas[1].block_manager.num_blocks == 32  # the replacement's pool
    faults = node.faults
    assert (faults.ranks_alive, faults.groups_serving, faults.groups_down) == (2, 2, ())
    assert faults.recovery_seconds is not None and faults.worker_restarts == 1
    assert node.worlds == [frozenset({0}), frozenset({1})]
    assert _place(node, _seq("b")) is node.replicas[1]  # the least loaded: the new one


def test_failed_attempts_back_off_then_the_ranks_are_given_up(tiny_llama_dir):
    node = _node(tiny_llama_dir, max_worker_restarts=2)
    lose_rank_1(node)
    node.executor.replaced.append(Outcome((1,), 0.1, reason="replacement rank 1 died"))
    node.take_losses()
    assert node.executor.replacing == [(1,)]  # backed off: not again at once
    (waiting,) = node.healing.waiting
    assert waiting.next_try > 0 and waiting.failures_in_a_row == 1
    waiting.next_try = 0.0
    node.take_losses()
    assert node.executor.replacing == [(1,), (1,)]
    node.executor.replaced.append(Outcome((1,), 0.1, reason="replacement rank 1 died"))
    node.take_losses()
    node.healing.waiting[0].next_try = 0.0
    node.take_losses()
    (given_up,) = node.faults.given_up
    assert given_up.ranks == (1,) and "max_worker_restarts 2" in given_up.reason
    assert "replacement rank 1 died" in given_up.reason
    assert node.executor.replacing == [(1,), (1,)] and not node.healing.waiting
    assert [g.ranks for g in node.faults.groups_down] == [(1,)]


def test_no_restarts_keeps_a_loss_for_good(tiny_llama_dir):
    node = _node(tiny_llama_dir, max_worker_restarts=0)
    node.executor.lose(1, "worker rank 1 died (killed by SIGKILL)")
    node.take_losses()
    node.take_losses()
    assert node.executor.replacing == [] and node.faults.worker_restarts == 0


def test_a_lost_host_is_waited_for_without_counting(tiny_llama_dir, monkeypatch):
    from parashift.executor.base import HostDown
    node = _node(tiny_llama_dir, max_worker_restarts=1)

    def host_down(ranks):
        raise HostDown("node 1 is lost")
    monkeypatch.setattr(node.executor, "replace", host_down)
    node.executor.lose(1, "worker rank 1 died (node 1 lost)")
    node.take_losses()
    for _ in range(3):
        (waiting,) = node.healing.waiting
        assert waiting.next_try > waiting.lost_at  # asked again in HOST_POLL_S
        waiting.next_try = 0.0
        node.take_losses()
    assert node.faults.worker_restarts == 0 and not node.faults.given_up
