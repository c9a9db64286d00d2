"""Hosts in plans: TP and SP groups inside a host, PP stages and DP replicas across."""
import json

import pytest

from parashift.cli import main
from parashift.config import EngineConfig
from parashift.engine.policy import make_policy
from parashift.engine.policy.flying import merged_plans
from parashift.parallel.comm_pool import CommunicatorPool
from parashift.parallel.layout import Layout
from parashift.parallel.plan import Plan
from parashift.parallel.topology import Topology


def test_ranks_are_numbered_host_by_host():
    topology = Topology.for_world(8, nnodes=2)
    assert topology.gpus_per_node == 4
    assert [topology.host_of(r) for r in range(8)] == [0] * 4 + [1] * 4
    assert list(topology.ranks_of(1)) == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="do not split evenly"):
        Topology.for_world(6, nnodes=4)
    with pytest.raises(ValueError, match="the plan has 6 ranks"):
        Topology.for_world(6, nnodes=2, gpus_per_node=4)


def test_pp_and_dp_cross_hosts_and_tp_does_not():
    topology = Topology(2, 3)
    topology.check_plan(Plan(pp=2, tp=3))  # a stage per host
    topology.check_plan(Plan(dp=2, tp=3))  # a replica per host
    assert topology.cross_host_groups(Plan(pp=2, tp=3)) == []
    with pytest.raises(ValueError, match=r"tp group \[0, 1, 2, 3, 4, 5\] on hosts \[0, 1\]"):
        topology.check_plan(Plan(tp=6))
    with pytest.raises(ValueError, match=r"sp group \[0, 2, 4\]"):  # TP pairs fit, SP not
        Topology(3, 2).check_plan(Plan(sp=3, tp=2))


def test_the_comm_pool_refuses_a_cross_host_tp_group_unless_asked():
    # refused before any process group is made (no torch.distributed needed)
    with pytest.raises(ValueError, match="stay inside a host"):
        CommunicatorPool(0, 4, [Plan(tp=4)], topology=Topology(2, 2))
    with pytest.raises(ValueError, match="stay inside a host"):  # a merge across hosts too
        CommunicatorPool(0, 4, [Plan.merged([Plan(tp=1).on((1,)), Plan(tp=1).on((2,))])],
                         topology=Topology(2, 2))


def test_flying_merges_only_within_a_host():
    replicas = list(Layout.of(Plan(dp=6)).plans)
    merges = merged_plans(replicas, num_heads=12, num_kv_heads=6, topology=Topology(2, 3))
    assert [p.name() for p in merges] == ["merge3-tp3", "merge3-tp3@3-5"]
    everywhere = merged_plans(replicas, num_heads=12, num_kv_heads=6)
    assert {p.merge_base[0] for p in everywhere} == {2, 3, 6}


def test_engine_config_refuses_tp_across_hosts():
    with pytest.raises(ValueError, match="stay inside a host"):
        EngineConfig(tensor_parallel_size=4, nnodes=2)
    config = EngineConfig(tensor_parallel_size=4, nnodes=2, allow_cross_host_tp=True)
    assert config.topology == Topology(2, 2)
    with pytest.raises(ValueError, match="node_rank must be in 0-1"):
        EngineConfig(pipeline_parallel_size=2, nnodes=2, node_rank=2)


LAYOUTS = [  # (policy, degrees) on 2 hosts x 4 ranks
    ("static", ["--pp", "2", "--tp", "4"]),
    ("static", ["--dp", "2", "--sp", "2", "--tp", "2"]),
    ("shift", ["--dp", "2", "--sp", "2", "--tp", "2"]),
    ("shift", ["--pp", "2", "--sp", "4"]),
    ("flying", ["--dp", "8"]),
    ("flying", ["--dp", "4", "--tp", "2"]),
]


@pytest.mark.parametrize("policy,degrees", LAYOUTS)
def test_plan_command_places_tp_inside_hosts_for_every_plan_of_the_policy(
        policy, degrees, tmp_path, capsys):
    model = tmp_path / "config.json"  # 16 heads: every merge width divides them
    model.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                 "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
                                 "num_hidden_layers": 2, "num_attention_heads": 16,
                                 "num_key_value_heads": 8, "max_position_embeddings": 128}))
    main(["plan", "--world", "8", *degrees, "--nnodes", "2", "--gpus-per-node", "4",
          "--parallel-policy", policy, "--model", str(model)])
    out = capsys.readouterr().out
    placed = [line.strip() for line in out.splitlines() if line.startswith("  ")
              and line.strip()[:10] in ("tp group [", "sp group [")]
    assert placed and all(": host " in line for line in placed), out
    # and the policy's own plans, built as the engine builds them
    config = EngineConfig(model=str(model), parallel_policy=policy, nnodes=2,
                          **_degrees(degrees))
    from parashift.loader.source import load_hf_config, resolve_model
    plans = make_policy(config, config.node_layout,
                        load_hf_config(resolve_model(str(model)))).plans
    assert len([line for line in out.splitlines() if line.startswith("placement of")]) == \
        len(plans)
    assert all(config.topology.cross_host_groups(plan) == [] for plan in plans)


def _degrees(flags: list[str]) -> dict:
    names = {"--pp": "pipeline_parallel_size", "--dp": "data_parallel_size",
             "--sp": "sequence_parallel_size", "--tp": "tensor_parallel_size"}
    return {names[flag]: int(value) for flag, value in zip(flags[::2], flags[1::2])}


def test_plan_command_refuses_tp_across_hosts(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--world", "8", "--tp", "8", "--nnodes", "2"])
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert "tp group [0, 1, 2, 3, 4, 5, 6, 7]: across hosts 0,1" in captured.out
    assert "stay inside a host" in captured.err
