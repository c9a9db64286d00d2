"""The node on its own (engine/node.py), driven without an engine or ranks: where requests
go, which replicas step in a round, and how a lost rank takes its group out while its
requests move on. Its merges and re-shards on real ranks: tests/distributed."""
import ast
import pathlib

import pytest
import torch

from parashift import SamplingParams
from parashift.config import EngineConfig
from parashift.engine.node import Node
from parashift.engine.sequence import Sequence
from parashift.executor import WorkerFailure
from parashift.executor.base import Executor
from parashift.loader.source import load_hf_config, resolve_model

ENGINE = pathlib.Path(__file__).resolve().parents[2] / "parashift" / "engine"


class FakeExecutor:
    """Ranks that report their pools and are lost when told."""

    def __init__(self, world_size: int, blocks: int = 64):
        self.rank_blocks = [blocks] * world_size
        self.failure, self.lost, self._unreported = None, {}, {}
        self.retired, self.replacing, self.replaced = [], [], []

    @property
    def alive(self) -> list[int]:
        return [r for r in range(len(self.rank_blocks)) if r not in self.lost]

    def lose(self, rank: int, reason: str) -> None:
        self.lost[rank] = self._unreported[rank] = reason

    def take_lost(self) -> dict[int, str]:
        lost, self._unreported = self._unreported, {}
        return lost

    def retire(self, ranks, reason: str) -> None:
        self.retired += list(ranks)

    def replace(self, ranks) -> None:
        self.replacing.append(tuple(ranks))

    def take_replaced(self) -> list:
        """What the test put in `replaced` (replacement.Outcome); those ok serve again."""
        done, self.replaced = self.replaced, []
        for outcome in done:
            for rank in outcome.ranks if outcome.ok else ():
                del self.lost[rank]
                self.rank_blocks[rank] = outcome.blocks[rank]
        return done

    def fail(self, message: str):
        self.failure = WorkerFailure(message)
        raise self.failure


def _node(model_dir, world_size: int = 2, **options) -> Node:
    config = EngineConfig(model=model_dir, device="cpu", data_parallel_size=world_size,
                          num_blocks=64, max_num_batched_tokens=2048,
                          long_prefill_token_threshold=0, **options)
    hf_config = load_hf_config(resolve_model(model_dir))
    node = Node(config, hf_config, torch.float32, max_model_len=256)
    node.start(FakeExecutor(world_size), eos_ids=set())
    return node


def _seq(request_id: str, prompt_tokens: int = 8, max_tokens: int = 8) -> Sequence:
    return Sequence(request_id, list(range(1, prompt_tokens + 1)),
                    SamplingParams(max_tokens=max_tokens))


def _place(node: Node, seq: Sequence):
    replica = node.route(seq)
    node.admit(seq, replica, now=0.0)
    return replica


def test_a_replica_per_group_and_requests_go_to_the_least_loaded(tiny_llama_dir):
    node = _node(tiny_llama_dir)
    assert [r.ranks for r in node.replicas] == [(0,), (1,)]
    first, second = _place(node, _seq("a")), _place(node, _seq("b"))
    assert first is not second
    assert node.holds("a") and node.replica_of["b"] is second and not node.holds("c")


def test_a_request_no_group_holds_waits_unplaced(tiny_llama_dir):
    node = _node(tiny_llama_dir)
    too_long = _seq("long", prompt_tokens=8, max_tokens=10_000)  # needs max_model_len
    node.max_context = {1: 128}  # as if each group held less than it needs
    for replica in node.replicas:
        replica.scheduler.config.max_model_len = 128
    assert node.route(too_long) is None
    node.hold(too_long)
    assert node.holds("long") and node.take_placeable() == []
    node.replicas[1].scheduler.config.max_model_len = 256  # a merge made a group that holds it
    assert node.take_placeable() == [(too_long, node.replicas[1])] and not node.unplaced


def test_a_round_holds_the_replicas_with_work_and_the_plan_of_each(tiny_llama_dir):
    node = _node(tiny_llama_dir)
    assert node.next_round() is None  # nothing to run
    replica = _place(node, _seq("a"))
    round_ = node.next_round()
    assert round_.alone == [replica] and round_.together == []
    assert node.plan_for(replica, round_.decision).ranks == replica.ranks


def test_a_lost_rank_takes_its_group_out_and_its_requests_move(tiny_llama_dir):
    node = _node(tiny_llama_dir)
    kept, moved = _place(node, _seq("a")), _place(node, _seq("b"))
    node.executor.lose(moved.ranks[0], f"worker rank {moved.ranks[0]} died (killed by SIGKILL)")
    assert node.take_losses() == []  # every request still has a group
    assert len(node.layout.plans) == 1 and node.replicas == [kept]
    assert node.replica_of["b"] is kept and kept.load == 2
    assert node.faults.requests_requeued == 1 and node.faults.groups_serving == 1
    assert [g.ranks for g in node.faults.groups_down] == [moved.ranks]


def test_the_last_group_lost_fails_the_node(tiny_llama_dir):
    node = _node(tiny_llama_dir, world_size=1)
    node.executor.lose(0, "worker rank 0 died (killed by SIGKILL)")
    with pytest.raises(WorkerFailure, match="no group of the node is left"):
        node.take_losses()
    with pytest.raises(WorkerFailure):  # and every later use
        node.take_losses()


def test_set_policy_refuses_plans_not_made_at_start_up(tiny_llama_dir):
    from parashift.engine.policy import StaticPolicy
    from parashift.parallel.layout import Layout
    node = _node(tiny_llama_dir)
    with pytest.raises(ValueError, match="not made at start-up"):
        node.set_policy(StaticPolicy(Layout.parse("merge2-tp2")))


def _imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


def test_the_node_never_calls_the_engine_back():
    for path in ENGINE.glob("node*.py"):
        assert "parashift.engine.llm_engine" not in _imports(path), path.name


def test_the_engine_knows_executors_only_by_their_protocol():
    for path in ENGINE.rglob("*.py"):
        imported = _imports(path)
        assert not {"parashift.worker.model_runner", "parashift.worker.worker",
                    "parashift.executor.multiproc", "parashift.executor.uniproc"} & imported, \
            path.name
        assert "isinstance(self.executor" not in path.read_text(), path.name


def test_every_executor_has_what_the_protocol_names():
    from parashift.executor.multiproc import MultiprocExecutor
    from parashift.executor.ray_executor import RayExecutor
    from parashift.executor.uniproc import UniprocExecutor
    members = [name for name in vars(Executor) if not name.startswith("_")]
    members += list(Executor.__annotations__)
    for kind in (UniprocExecutor, MultiprocExecutor, RayExecutor):
        missing = [m for m in members if not hasattr(kind, m) and m not in
                   ("rank_blocks", "load_seconds", "failure", "lost")]
        assert not missing, (kind.__name__, missing)
