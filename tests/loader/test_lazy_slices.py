"""A rank reads only its shard of a safetensors tensor."""
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from parashift.layers.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from parashift.lazy_tensor import LazySlice
from parashift.parallel.plan import Plan
from parashift.context import use_state
from parashift.parallel.state import GroupHandle, ParallelState


def tp_state(rank: int, size: int) -> ParallelState:
    tp = GroupHandle(tuple(range(size)), rank)
    return ParallelState(Plan(tp=size), rank, tp, GroupHandle((rank,), rank),
                         GroupHandle((rank,), rank), GroupHandle((rank,), rank))


def test_narrowed_slices_read_exactly_their_rows_and_columns(tmp_path):
    full = torch.arange(48.0).reshape(6, 8)
    save_file({"w": full}, tmp_path / "w.safetensors")
    with safe_open(str(tmp_path / "w.safetensors"), framework="pt") as f:
        lazy = LazySlice(f.get_slice("w"), (6, 8))
        assert lazy.shape == (6, 8) and lazy.dim() == 2
        assert torch.equal(lazy.narrow(1, 2, 4).narrow(0, 1, 3).materialize(), full[1:4, 2:6])
        assert torch.equal(lazy[4:].materialize(), full[4:])


def test_sharded_layers_load_the_same_from_lazy_and_full_tensors(tmp_path):
    torch.manual_seed(0)
    weights = {"col": torch.randn(8, 4), "row": torch.randn(4, 8), "k": torch.randn(2 * 4, 8)}
    save_file(weights, tmp_path / "w.safetensors")
    with safe_open(str(tmp_path / "w.safetensors"), framework="pt") as f:
        for rank in range(2):
            with use_state(tp_state(rank, 2)):
                layers = [(ColumnParallelLinear(4, 8), "col", None),
                          (RowParallelLinear(8, 4), "row", None),
                          (QKVParallelLinear(8, 4, 4, 2), "k", "k")]
            for layer, name, shard in layers:
                lazy = LazySlice(f.get_slice(name), tuple(weights[name].shape))
                loaded = []
                for source in (lazy, weights[name]):
                    layer.weight.data.zero_()
                    layer.weight_loader(layer.weight, source, *([shard] if shard else []))
                    loaded.append(layer.weight.clone())
                assert torch.equal(*loaded) and loaded[0].abs().sum() > 0
