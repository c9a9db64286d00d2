"""A Seesaw switch's transfers (parallel/reshard_schedule.py) from every rank's arena layout
and the checkpoint boxes its parameters hold (loader/weight_pieces.py), with no process
group: which rank sends which rows or columns of which layer to whom under PP2 -> TP2, that
no round writes bytes a later round reads, and the pieces the loaders' own sharding gives
(packed q/k/v and gate/up, replicated KV heads, a vocabulary shard's padding)."""
import pytest
import torch

from parashift.context import use_state
from parashift.loader.source import load_hf_config, resolve_model
from parashift.loader.weight_pieces import checkpoint_shapes, parameter_pieces
from parashift.parallel.pieces import Piece
from parashift.models.registry import model_class_for
from parashift.parallel.arena_layout import overlaps
from parashift.parallel.plan import Plan
from parashift.parallel.reshard_schedule import reshard_schedule, staging_demand
from parashift.parallel.state import ParallelState
from parashift.worker.peer_weights import group_weights
from tests.engine.conftest import save_tiny_llama

H, HEADS, KV, HD, INTER, VOCAB, LAYERS = 64, 4, 2, 16, 128, 510, 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = save_tiny_llama(tmp_path_factory.mktemp("schedule_llama"), num_hidden_layers=LAYERS,
                           num_key_value_heads=KV, vocab_size=VOCAB)
    source = resolve_model(path)
    return load_hf_config(source), checkpoint_shapes(source.path)


def weights_of(tiny, *names):
    hf_config, shapes = tiny
    return group_weights(hf_config, shapes, [Plan.parse(n) for n in names], torch.float32, 64)


def tp2_box(tensor: str, p: int):
    """The box of checkpoint tensor `tensor` that TP2 rank `p` holds, written out by hand."""
    leaf = tensor.split(".")[-2]
    rows = {"q_proj": H // 2, "k_proj": HD, "v_proj": HD, "gate_proj": INTER // 2,
            "up_proj": INTER // 2, "embed_tokens": VOCAB // 2, "lm_head": VOCAB // 2}
    cols = {"q_proj": H, "k_proj": H, "v_proj": H, "gate_proj": H, "up_proj": H,
            "embed_tokens": H, "lm_head": H}
    if leaf in rows:
        return ((p * rows[leaf], (p + 1) * rows[leaf]), (0, cols[leaf]))
    if leaf in ("o_proj", "down_proj"):  # row-parallel: input columns
        width = (H if leaf == "o_proj" else INTER) // 2
        return ((0, H), (p * width, (p + 1) * width))
    return ((0, H),)  # norms: whole


def pp2_holder(tensor: str) -> int:
    """The PP2 rank whose stage holds `tensor` (layers 0-1 and the embedding on rank 0)."""
    parts = tensor.split(".")
    if parts[1] == "layers":
        return int(parts[2]) // 2
    return 0 if "embed_tokens" in tensor else 1


def merged(schedule):
    """(kind, from, to, tensor, box) of every transfer, row-cut parts joined."""
    out = {}
    for t in schedule.transfers():
        key = (t.kind, t.src.rank if t.src else None, t.dst.rank, t.tensor, t.full[1:])
        out.setdefault(key, []).append(t.full[0])
    joined = set()
    for (kind, src, dst, tensor, rest), rows in out.items():
        rows.sort()
        assert all(a[1] == b[0] for a, b in zip(rows, rows[1:])), "row parts leave a gap"
        joined.add((kind, src, dst, tensor, ((rows[0][0], rows[-1][1]),) + rest))
    return joined


def test_pp2_to_tp2_sends_each_rank_its_shard_of_the_other_stage(tiny):
    ranks = weights_of(tiny, "pp2", "tp2")
    schedule = reshard_schedule(ranks, "pp2", "tp2", staging_bytes=2**30)
    tensors = [name for name in tiny[1]]
    expected = set()
    for p in (0, 1):
        for tensor in tensors:
            holder = pp2_holder(tensor)
            kind = "local" if holder == p else "peer"
            expected.add((kind, holder, p, tensor, tp2_box(tensor, p)))
    # rank 0's half of the embedding sits where PP2 rank 0 holds those rows: nothing moves
    expected.remove(("local", 0, 0, "model.embed_tokens.weight", tp2_box("embed_tokens.w", 0)))
    assert merged(schedule) == expected
    # e.g. rank 1 sends rank 0 layer 3's first half of the gate rows and of the down columns
    assert ("peer", 1, 0, "model.layers.3.mlp.gate_proj.weight", ((0, 64), (0, 64))) in expected
    assert ("peer", 1, 0, "model.layers.3.mlp.down_proj.weight", ((0, 64), (0, 64))) in expected
    # the regions overlap whole: every chunk is filled, all of it from peers or the rank itself
    assert all(len(schedule.needed[r]) == len(ranks[r].layouts["tp2"].chunks) for r in ranks)
    assert all(schedule.bytes_into(r)["host"] == 0 for r in ranks)
    assert len(schedule.phase2) == 1 and not schedule.phase1


@pytest.mark.parametrize("prefill, decode", [("pp2", "tp2"), ("pp2xtp2", "tp4"),
                                              ("pp4", "pp2xtp2")])
@pytest.mark.parametrize("back", [False, True], ids=["to_decode", "to_prefill"])
@pytest.mark.parametrize("staging", [2**30, 48 * 2**10, 12 * 2**10])
def test_no_destination_is_written_before_its_reads(tiny, prefill, decode, back, staging):
    ranks = weights_of(tiny, prefill, decode)  # the prefill plan at the arena's start
    old, new = (decode, prefill) if back else (prefill, decode)
    schedule = reshard_schedule(ranks, old, new, staging)
    for transfers in schedule.phase1:  # clear of the running region: it overwrites no source
        for t in transfers:
            w = ranks[t.dst.rank]
            old_start = w.offsets[old]
            assert not overlaps(*t.dst.extent(), old_start, old_start + w.layouts[old].size)
    round_of = {}
    for k, transfers in enumerate(schedule.phase2):
        send, recv = staging_demand(transfers)
        assert max([*send.values(), *recv.values(), 0]) <= staging
        for t in transfers:
            round_of[id(t)] = (k, t)
    for k, reader in round_of.values():
        if reader.src is None:
            continue
        for j, writer in round_of.values():
            if writer.dst.rank == reader.src.rank and overlaps(*reader.src.extent(),
                                                                *writer.dst.extent()):
                assert k <= j, "a round writes bytes a later round reads"
    # every byte of every filled chunk written once (dropped transfers: already in place)
    for rank, w in ranks.items():
        layout = w.layouts[new]
        filled = sum(t.nbytes for t in schedule.transfers() if t.dst.rank == rank)
        needed = sum(p.nbytes for c in schedule.needed[rank]
                     for p in layout.params_in(layout.chunks[c]))
        assert filled <= needed
        host = schedule.bytes_into(rank)["host"]
        assert host == schedule.unheld[rank] + schedule.cycle[rank]
        assert schedule.unheld[rank] == 0  # both plans hold the whole model between them
        if staging == 2**30:
            assert schedule.cycle[rank] == 0 and len(schedule.phase2) == 1


def test_pieces_follow_the_layers_sharding(tiny):
    """TP4 over 2 KV heads: ranks 2 and 3 hold KV head 1 (replicated); the vocabulary's 510
    rows in shards of 128: the last rank holds 126 and zeros."""
    hf_config, shapes = tiny
    with use_state(ParallelState.unconnected(Plan.parse("tp4"), 3)), torch.device("meta"):
        model = model_class_for(hf_config)(hf_config, 64)
    pieces = parameter_pieces(model, shapes)
    qkv = {p.tensor.split(".")[-2]: p for p in pieces["model.layers.0.self_attn.qkv_proj.weight"]}
    assert qkv["q_proj"] == Piece("model.layers.0.self_attn.q_proj.weight", ((48, 64), (0, H)),
                                  ((0, 16), (0, H)), (0, 1))
    assert qkv["k_proj"].full == ((HD, 2 * HD), (0, H)) and qkv["k_proj"].at == ((16, 32), (0, H))
    assert qkv["v_proj"].at == ((32, 48), (0, H))
    embed = pieces["model.embed_tokens.weight"]
    assert Piece("model.embed_tokens.weight", ((384, 510), (0, H)), ((0, 126), (0, H)),
                 (0, 1)) in embed
    assert Piece(None, (), ((126, 128), (0, H)), ()) in embed
    down = pieces["model.layers.2.mlp.down_proj.weight"]
    assert down == [Piece("model.layers.2.mlp.down_proj.weight", ((0, H), (96, 128)),
                          ((0, H), (0, 32)), (0, 1))]


def test_what_no_rank_holds_comes_from_the_host_copy(tiny):
    """Rank 0 alone (its peer left out): TP2 rank 0's half of layers 2-3, the final norm
    and the LM head are held by no rank's PP2 stage, so they are read from its host copy."""
    ranks = {0: weights_of(tiny, "pp2", "tp2")[0]}
    schedule = reshard_schedule(ranks, "pp2", "tp2", staging_bytes=2**30)
    from_host = {t.tensor for t in schedule.transfers() if t.kind == "host"}
    assert from_host == {name for name in tiny[1] if pp2_holder(name) == 1}
    assert schedule.unheld[0] == schedule.bytes_into(0)["host"] > 0 and schedule.cycle[0] == 0


@pytest.mark.parametrize("prefill, decode", [("pp2", "tp2"), ("pp2xtp2", "tp4"),
                                              ("pp4", "pp2xtp2")])
@pytest.mark.parametrize("back", [False, True], ids=["to_decode", "to_prefill"])
def test_cycles_too_large_to_stage_keep_local_copies_local(tiny, prefill, decode, back):
    """A cycle is broken by reading a peer's piece from the host, never a piece the rank
    copies from its own old shard: each rank copies on the device all it would with every
    cycle staged, and receives (from peers or its host copy) no more than it lacks."""
    ranks = weights_of(tiny, prefill, decode)
    old, new = (decode, prefill) if back else (prefill, decode)
    staged = reshard_schedule(ranks, old, new, 2**30)
    broken = reshard_schedule(ranks, old, new, 12 * 2**10)
    assert sum(broken.cycle.values()) > 0
    for rank in ranks:
        whole, cut = staged.bytes_into(rank), broken.bytes_into(rank)
        assert cut["local"] == whole["local"]
        assert cut["peer"] + cut["host"] == whole["peer"]
