"""SiDP's slots on one process: each layer's slot holds its owners' slices laid out as the
whole TP shard ([gate_0 .. gate_d-1 | up_0 .. up_d-1], down's columns in owner order), is
refilled `slots` layers ahead once its layer is done (on a copy stream, joined by an event,
on CUDA), and the FFN block run on the slot computes what the whole shard computes. The
owners here are tensors of this process; the gloo tests (tests/distributed/test_sidp.py)
read other ranks' memory."""
from types import SimpleNamespace

import pytest
import torch

from parashift.context import StepContext, use_context
from parashift.models.llama import LlamaMLP
from parashift.parallel.state import ParallelState
from parashift.worker.ffn_slices import WAS_WEIGHTS, FfnSlice, FfnSlots, _slice_of

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
HIDDEN, ROWS, OWNERS, LAYERS = 32, 8, 3, 4  # each owner's slice: 8 of 24 intermediate rows


def whole_shard_mlp(device, seed):
    """A full-shard FFN block (intermediate OWNERS * ROWS) with random weights."""
    cfg = SimpleNamespace(hidden_size=HIDDEN, intermediate_size=OWNERS * ROWS)
    with torch.device(device):
        mlp = LlamaMLP(cfg)
    gen = torch.Generator().manual_seed(seed)
    for p in mlp.parameters():
        p.data.copy_(torch.randn(p.shape, generator=gen))
    return mlp


def owner_slices(whole: LlamaMLP) -> list[FfnSlice]:
    """The whole shard cut into OWNERS slices: gate and up rows, down columns."""
    inter = OWNERS * ROWS
    gate_up, down = whole.gate_up_proj.weight.data, whole.down_proj.weight.data
    return [FfnSlice(torch.cat([gate_up[p * ROWS:(p + 1) * ROWS],
                                gate_up[inter + p * ROWS:inter + (p + 1) * ROWS]]).clone(),
                     None, down[:, p * ROWS:(p + 1) * ROWS].clone()) for p in range(OWNERS)]


def sliced_mlp(device, piece: FfnSlice):
    """This rank's FFN block as SiDP loads it: the slice it owns."""
    cfg = SimpleNamespace(hidden_size=HIDDEN, intermediate_size=ROWS)
    with torch.device(device):
        mlp = LlamaMLP(cfg)
    mlp.gate_up_proj.weight.data.copy_(piece.gate_up)
    mlp.down_proj.weight.data.copy_(piece.down)
    return mlp


@pytest.mark.parametrize("device", DEVICES)
def test_slots_hold_the_whole_shard_and_refill_ahead(device):
    position = 1  # this rank owns the second slice of every layer
    wholes = [whole_shard_mlp(device, seed) for seed in range(LAYERS)]
    pieces = [owner_slices(w) for w in wholes]  # [layer][owner]
    modules = [sliced_mlp(device, layer[position]) for layer in pieces]
    owners = SimpleNamespace(local=[_slice_of(m) for m in modules],
                             by_peer=[[layer[p] for layer in pieces] for p in range(OWNERS)])
    slots = FfnSlots(modules, owners, position, count=2, device=torch.device(device))
    x = torch.randn(7, HIDDEN, device=device)
    expected = [whole(x) for whole in wholes]
    with use_context(StepContext(ParallelState.single(), WAS_WEIGHTS)):
        for step in range(2):  # the second step finds layers 0 and 1 fetched ahead
            for layer, (module, whole, want) in enumerate(zip(modules, wholes, expected)):
                slots.ready(layer)
                slot = slots.slots[layer % 2]
                assert torch.equal(slot.gate_up, whole.gate_up_proj.weight.data)
                assert torch.equal(slot.down, whole.down_proj.weight.data)
                assert torch.equal(module(x), want)
                slots.release(layer)
            if device == "cuda":
                torch.cuda.synchronize()
    assert slots.held == [0, 1]  # the next step's first layers, fetched during this one's tail
    per_fetch = 2 * (2 * ROWS * HIDDEN + HIDDEN * ROWS) * 4  # two peers' slices, fp32
    assert slots.bytes_fetched == per_fetch * (2 * LAYERS + 2)  # each layer once a step


def test_counts_from_the_engine_are_checked_against_the_rows_run():
    """A counted CaS round takes each peer's rows from the engine (no exchange): a rank
    whose forward runs other rows than the engine's count for it stops with both."""
    from parashift.worker.shared_ffn import SharedFfn
    ffn = SimpleNamespace(peers=SimpleNamespace(ranks=(1, 3), rank=1),
                          _state=SimpleNamespace(rank=3), round_id=5, rows=0,
                          rounds={"padded": 0, "counted": 0})
    SharedFfn.begin_step(ffn, 5, 0, {0: 7, 1: 7, 2: 4, 3: 4})
    assert ffn._counts == [7, 4]
    assert SharedFfn._step_counts(ffn, 4) == [7, 4]
    with pytest.raises(RuntimeError, match="rank 3 runs 5 FFN rows .* gives it 4"):
        SharedFfn._step_counts(ffn, 5)
    SharedFfn.begin_step(ffn, 6, 8, {0: 7, 1: 7, 2: 4, 3: 4})  # a padded round: no counts
    assert ffn._counts is None and ffn.rows == 8
