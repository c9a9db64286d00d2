"""When steps replay CUDA graphs unless the user says (the default's rule), which bucket a
step takes and how it is padded (the graphs themselves run on GPUs only:
tests/engine/test_gpu_engine.py and the NCCL tests)."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from parashift.sampling_params import SamplingParams
from parashift.uploads import StagingRing
from parashift.worker.cuda_graphs import Bucket, GraphSizes, input_layout
from parashift.worker.model_runner import ModelRunner, graphs_by_default
from parashift.worker.step_chunks import SeqChunk
from parashift.worker.step_check import rebuild
from parashift.worker.step_inputs import build_step_inputs
from parashift.worker.seesaw import SeesawRank
from parashift.worker.shared_ffn import CAS_WEIGHTS, WAS_WEIGHTS, SharedFfn


def _plan(name, pp=1, weights=None):
    return SimpleNamespace(name=name, state=SimpleNamespace(pp=SimpleNamespace(size=pp)),
                           weights=weights)


@pytest.mark.parametrize("possible, every_plan, some_plans, expected", [
    (True, True, False, True),     # static plans, pipelined or not, experts or not; SiDP CaS
    (True, False, False, False),   # plans some of which cannot, a design not asking for some
    (True, False, True, True),     # Seesaw's decode plan; the sidp policy's CaS plans
    (False, True, False, False),   # CPU, torch attention
    (False, False, True, False),
])
def test_graphs_by_default(possible, every_plan, some_plans, expected):
    assert graphs_by_default(possible, every_plan, some_plans) is expected


def _runner(plans, hooks, device="cuda", backend="triton", deterministic=False):
    """What `ModelRunner._use_graphs` reads of a rank at start-up."""
    runner = SimpleNamespace(resources={p.name: p for p in plans}, hooks=list(hooks),
                             device=torch.device(device), backend=SimpleNamespace(name=backend),
                             config=SimpleNamespace(deterministic=deterministic),
                             expert_placement=lambda: [], state=SimpleNamespace(rank=0))
    runner._graph_plans = lambda: ModelRunner._graph_plans(runner)
    return runner


SIDP_POLICY = [_plan("dp2-cas", weights=CAS_WEIGHTS), _plan("dp2-was", weights=WAS_WEIGHTS)]


@pytest.mark.parametrize("requested, device, expected", [
    (None, "cuda", True),    # the default: the CaS plans replay graphs, the WaS plans eager
    (True, "cuda", True),    # --cuda-graphs: the same
    (False, "cuda", False),  # --no-cuda-graphs: every step eagerly
    (None, "cpu", False),    # no CUDA: none
])
def test_the_sidp_policys_cas_plans_replay_graphs_by_default(requested, device, expected,
                                                             caplog):
    """The sidp policy's start-up (its WaS and CaS plans both made, SiDP's hooks): the
    fortieth session's full-length `tail` took 85.7 s with the CaS plans' graphs, and did
    not end in 185 s without them (thirty-ninth)."""
    runner = _runner(SIDP_POLICY, [SharedFfn], device)
    with caplog.at_level("INFO", logger="parashift.worker.model_runner"):
        assert ModelRunner._use_graphs(runner, requested) is expected
    if requested is None and device == "cuda":
        assert ("decode steps of dp2-cas replay CUDA graphs; those of dp2-was run eagerly"
                in caplog.text)


def test_a_design_not_asking_for_some_plans_runs_every_step_eagerly(caplog):
    class AllOrNone(SharedFfn):
        graphs_for_some_plans = False
    runner = _runner(SIDP_POLICY, [AllOrNone])
    with caplog.at_level("INFO", logger="parashift.worker.model_runner"):
        assert ModelRunner._use_graphs(runner, None) is False
    assert "decode steps run eagerly: dp2-was cannot replay CUDA graphs" in caplog.text
    assert ModelRunner._use_graphs(_runner(SIDP_POLICY[:1], [AllOrNone]), None) is True


def _graph_plan_names(resources, hooks=()):
    runner = SimpleNamespace(resources={r.name: r for r in resources}, hooks=list(hooks))
    return [r.name for r in ModelRunner._graph_plans(runner)]


def test_which_plans_replay_graphs():
    """Pipelined plans replay their stages' graphs, except a Seesaw prefill plan (its
    weights leave the device while the decode plan runs); sharing FFN weights, only CaS."""
    assert _graph_plan_names([_plan("tp2"), _plan("pp2", pp=2)]) == ["tp2", "pp2"]
    assert _graph_plan_names([_plan("pp2", pp=2), _plan("tp2")], hooks=[SeesawRank]) == ["tp2"]
    assert _graph_plan_names([_plan("was", weights=WAS_WEIGHTS), _plan("cas", weights=CAS_WEIGHTS)],
                             hooks=[SharedFfn]) == ["cas"]


def test_decode_steps_take_the_smallest_bucket_that_holds_them():
    sizes = GraphSizes(max_num_seqs=64, sp_sizes={1})
    assert sizes.decode == [1, 2, 4, 8, 16, 24, 32, 48, 64]
    assert sizes.for_step(rows=5, seqs=5) == Bucket(8, 8)
    assert sizes.for_step(rows=5, seqs=5, at_least=20) == Bucket(24, 24)  # a CaS round's rows
    assert sizes.for_step(rows=65, seqs=65) is None
    assert sizes.mixed_rows == []  # not asked for: every step that prefills runs eagerly
    assert sizes.for_step(rows=40, seqs=2) is None


def test_steps_that_prefill_take_a_mixed_bucket_of_enough_rows():
    sizes = GraphSizes(max_num_seqs=256, sp_sizes={1, 2}, max_mixed_rows=8192)
    assert sizes.mixed_rows == [256, 512, 1024, 2048] and sizes.mixed_seqs == 64
    assert sizes.for_step(rows=7, seqs=3) == Bucket(256, 64)  # a short prefill beside decodes
    assert sizes.for_step(rows=300, seqs=3) == Bucket(512, 64)
    assert sizes.for_step(rows=2048, seqs=1) == Bucket(2048, 64)
    assert not Bucket(2048, 64).decode and Bucket(64, 64).decode
    assert sizes.for_step(rows=2049, seqs=1) is None      # above the largest: eager
    assert sizes.for_step(rows=300, seqs=65) is None      # more sequences than a graph holds
    assert sizes.for_step(rows=300, seqs=3, at_least=4) is None  # CaS rounds are decodes


def test_mixed_buckets_follow_the_step_budget_the_sequence_cap_and_sp():
    assert GraphSizes(256, {1}, max_mixed_rows=1000).mixed_rows == [256, 512]
    small = GraphSizes(16, {1}, max_mixed_rows=4096)
    assert small.mixed_seqs == 16 and small.for_step(rows=100, seqs=16) == Bucket(256, 16)
    assert GraphSizes(256, {3}, max_mixed_rows=4096).mixed_rows == []  # no row count splits in 3
    captured = GraphSizes(8, {1}, max_mixed_rows=512).captured
    assert captured(single_stage=True) == [Bucket(512, 8), Bucket(256, 8), Bucket(8, 8),
                                           Bucket(4, 4), Bucket(2, 2), Bucket(1, 1)]
    assert captured(single_stage=False) == [Bucket(8, 8), Bucket(4, 4), Bucket(2, 2),
                                            Bucket(1, 1)]  # a pipeline stage: decodes only


def test_wide_mixed_buckets_hold_a_prompt_chunk_beside_a_full_batch(monkeypatch):
    """PARASHIFT_MIXED_GRAPH_WIDE_SEQS: buckets of 512 rows and more holding up to that many
    sequences beside the 64-sequence ones; a step of at most 64 sequences keeps its narrow
    bucket, one of more takes the smallest wide bucket of enough rows."""
    from parashift.worker import cuda_graphs
    monkeypatch.setattr(cuda_graphs, "WIDE_SEQS", 256)
    sizes = GraphSizes(max_num_seqs=256, sp_sizes={1, 2}, max_mixed_rows=16384)
    assert [(b.rows, b.seqs) for b in sizes.mixed] == [
        (256, 64), (512, 64), (512, 256), (1024, 64), (1024, 256), (2048, 64), (2048, 256)]
    assert sizes.most_mixed_seqs == 256
    assert sizes.for_step(rows=7, seqs=3) == Bucket(256, 64)
    assert sizes.for_step(rows=600, seqs=64) == Bucket(1024, 64)
    assert sizes.for_step(rows=830, seqs=256) == Bucket(1024, 256)  # a chunk beside 255 decodes
    assert sizes.for_step(rows=100, seqs=65) == Bucket(512, 256)    # few rows, many sequences
    assert sizes.for_step(rows=512, seqs=200) == Bucket(512, 256)
    assert sizes.for_step(rows=2049, seqs=100) is None               # above the largest: eager
    assert sizes.for_step(rows=300, seqs=257) is None
    captured = sizes.captured(single_stage=True)
    assert captured[:3] == [Bucket(2048, 256), Bucket(2048, 64), Bucket(1024, 256)]
    assert GraphSizes(128, {1}, 4096).most_mixed_seqs == 128  # capped by the seats
    assert [b.seqs for b in GraphSizes(128, {1}, 1000).mixed] == [64, 64, 128]
    assert GraphSizes(64, {1}, 4096).wide_seqs == 0            # no wider than the narrow ones
    assert [b.rows for b in GraphSizes(256, {1}, 400).mixed] == [256]  # budget under 512 rows
    monkeypatch.setattr(cuda_graphs, "WIDE_SEQS", 0)
    assert GraphSizes(256, {1}, 16384).most_mixed_seqs == 64   # off: today's buckets
    monkeypatch.setattr(cuda_graphs, "WIDE_SEQS", -1)
    with pytest.raises(ValueError, match="PARASHIFT_MIXED_GRAPH_WIDE_SEQS"):
        GraphSizes(256, {1}, 16384)


def test_verification_steps_take_small_mixed_buckets_with_speculation():
    sizes = GraphSizes(256, {1}, max_mixed_rows=8192, verify_rows=True)
    assert [(b.rows, b.seqs) for b in sizes.mixed] == [
        (8, 4), (16, 8), (32, 16), (64, 32), (128, 64), (256, 64), (512, 64), (1024, 64),
        (2048, 64)]
    assert sizes.for_step(rows=5, seqs=1) == Bucket(8, 4)      # batch 1, k = 4
    assert sizes.for_step(rows=9, seqs=3) == Bucket(16, 8)     # batch 3, k = 2
    assert sizes.for_step(rows=36, seqs=4) == Bucket(64, 32)   # batch 4, k = 8
    assert sizes.for_step(rows=40, seqs=20) == Bucket(64, 32)  # more sequences than (32, 16)
    assert sizes.for_step(rows=200, seqs=40) == Bucket(256, 64)
    assert GraphSizes(256, {1}, max_mixed_rows=8192).for_step(rows=5, seqs=1) == Bucket(256, 64)
    assert [b.rows for b in GraphSizes(256, {2, 4}, 8192, verify_rows=True).mixed][:3] == [8, 16, 32]
    assert GraphSizes(256, {1}, 0, verify_rows=True).mixed == []  # no mixed graphs at all
    captured = GraphSizes(4, {1}, max_mixed_rows=256, verify_rows=True).captured
    assert captured(single_stage=True) == [Bucket(256, 4), Bucket(128, 4), Bucket(64, 4),
                                           Bucket(32, 4), Bucket(16, 4), Bucket(8, 4),
                                           Bucket(4, 4), Bucket(2, 2), Bucket(1, 1)]


def test_a_mixed_step_padded_to_its_bucket_matches_the_rebuild():
    """Rows and sequences padded apart (a mixed graph's shape): padding rows write no KV,
    padding sequences hold no rows and no context."""
    tables = np.zeros((4, 8), np.int32)
    tables[0, :3], tables[2, :2] = [5, 6, 7], [9, 3]
    chunks = [SeqChunk("a", [11, 12, 13, 14, 15], 4, 0, SamplingParams(max_tokens=1)),
              SeqChunk("b", [21], 6, 2, SamplingParams(max_tokens=1))]
    inputs = build_step_inputs(chunks, tables, 4, torch.device("cpu"), pad_to=16, pad_seqs=8)
    want = rebuild(chunks, {"a": [5, 6, 7], "b": [9, 3]}, 4, 1, 0, 16, 8)
    attn = inputs.attn
    assert attn.query_start_loc.tolist() == [0, 5, 6, 6, 6, 6, 6, 6, 6]
    assert attn.seq_lens.tolist() == [9, 7, 0, 0, 0, 0, 0, 0]
    assert attn.slot_mapping.tolist() == [24, 25, 26, 27, 28, 14] + [-1] * 10
    for name, value in want["attn"].items():
        got = getattr(attn, name)
        assert (got.tolist() if isinstance(got, torch.Tensor) else got) == value, name
    assert inputs.token_ids.tolist() == want["token_ids"] and len(want["token_ids"]) == 16
    assert inputs.sample_rows == want["sample_rows"] == [4, 5]


@pytest.mark.parametrize("bucket, sp_size, sp_rank", [
    (Bucket(8, 8), 1, 0), (Bucket(16, 8), 1, 0), (Bucket(8, 8), 2, 1)])
def test_a_step_packed_into_the_graph_buffer_lands_where_its_graph_reads(bucket, sp_size,
                                                                         sp_rank):
    """The pack of a step padded to its bucket, copied into a graph's input buffer, puts
    each array at `input_layout`'s offset (the views the graph was captured with), with the
    values build_step_inputs gives without the buffer; its block tables come last."""
    tables = np.zeros((4, 8), np.int32)
    tables[0, :3], tables[2, :2] = [5, 6, 7], [9, 3]
    params = SamplingParams(max_tokens=1)
    chunks = [SeqChunk("a", [11], 9, 0, params), SeqChunk("b", [21], 6, 2, params)]
    if not bucket.decode:
        chunks[0] = SeqChunk("a", [11, 12, 13], 7, 0, params)
    packed = torch.zeros(1 << 12, dtype=torch.uint8)
    ring = StagingRing(torch.device("cpu"))
    args = (chunks, tables, 4, torch.device("cpu"), sp_size, sp_rank)
    inputs = build_step_inputs(*args, pad_to=bucket.rows, pad_seqs=bucket.seqs,
                               staging=ring, into=packed)
    plain = build_step_inputs(*args, pad_to=bucket.rows, pad_seqs=bucket.seqs)
    got = [inputs.token_ids, inputs.positions, inputs.attn.slot_mapping,
           inputs.attn.query_start_loc, inputs.attn.seq_lens]
    want = [plain.token_ids, plain.positions, plain.attn.slot_mapping,
            plain.attn.query_start_loc, plain.attn.seq_lens]
    for tensor, expected, (start, length, dtype) in zip(got, want,
                                                        input_layout(bucket, sp_size)):
        assert tensor.data_ptr() - packed.data_ptr() == start
        assert (len(tensor), tensor.dtype) == (length, dtype)
        assert packed[start:start + length * dtype.itemsize].view(dtype).tolist() \
            == expected.tolist()
    end = max(start + length * dtype.itemsize for start, length, dtype in
              input_layout(bucket, sp_size))
    assert inputs.attn.block_tables.data_ptr() - packed.data_ptr() >= end
    assert inputs.attn.block_tables.tolist() == plain.attn.block_tables.tolist()
    with pytest.raises(ValueError, match="does not fit"):
        build_step_inputs(*args, pad_to=bucket.rows, pad_seqs=bucket.seqs,
                          staging=ring, into=packed[:64])
