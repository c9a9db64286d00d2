"""The canonical order of a row-parallel contraction: every TP degree's terms, gathered and
added, give one device's bits; the layouts of the terms, exactly."""
import pytest
import torch

from parashift.deterministic import matmul
from parashift.deterministic.reduction import (add_pair, add_terms, rank_terms, row_groups,
                                               term_layout)
from tests.kernels.common import assert_exact, cuda, randn


def test_two_ranks_send_one_term_each():
    layout = term_layout(8, 2)
    assert layout.runs == (((0, 4, True),), ((0, 4, True),))
    assert layout.groups == (((0, 0),), ((1, 0),))
    assert layout.width == 1


def test_a_group_over_several_ranks_continues_its_first_ranks_sum():
    four = term_layout(8, 4)  # ranks 1 and 3 send their two chunks' partials
    assert four.runs == (((0, 2, True),), ((0, 2, False),), ((0, 2, True),), ((0, 2, False),))
    assert four.groups == (((0, 0), (1, 0), (1, 1)), ((2, 0), (3, 0), (3, 1)))
    assert four.width == 2
    three = term_layout(6, 3)  # rank 1's chunks 2 and 3 straddle the halves
    assert three.runs == (((0, 2, True),), ((0, 1, False), (1, 1, True)), ((0, 2, False),))
    assert three.groups == (((0, 0), (1, 0)), ((1, 1), (2, 0), (2, 1)))
    assert term_layout(3, 3).groups == (((0, 0), (1, 0), (2, 0)),)  # odd chunks: one group


def test_a_tp_degree_must_divide_the_chunks():
    with pytest.raises(ValueError, match="does not divide the 8 K chunks"):
        term_layout(8, 3)


def tp_sum(x, w, b, chunks: int, tp: int) -> torch.Tensor:
    """What each rank of a TP group of `tp` computes: its shard's terms, the group's
    terms gathered (padded to the layout's width), added in the canonical order."""
    layout, shard = term_layout(chunks, tp), x.shape[1] // tp
    terms = [rank_terms(x[:, r * shard:(r + 1) * shard], w[:, r * shard:(r + 1) * shard],
                        layout, r) for r in range(tp)]
    every = torch.stack([torch.cat([t, t.new_zeros((layout.width - len(t), *t.shape[1:]))])
                         for t in terms])
    return add_terms(every, b, x.dtype, layout)


@pytest.mark.parametrize("chunks, tp", [(8, 2), (8, 4), (8, 8), (6, 2), (6, 3), (6, 6),
                                        (3, 3)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_tp_terms_add_up_to_one_devices_bits(chunks, tp, dtype, device):
    k = chunks * 128  # two 64-wide tiles per chunk
    x, w = randn((5, k), dtype, device, seed=1), randn((24, k), dtype, device, seed=2)
    b = randn((24,), dtype, device, seed=3)
    one_device = matmul.reduce_chunks(x, w, b, chunks, row_groups(chunks))
    assert_exact(tp_sum(x, w, b, chunks, tp), one_device)


def test_the_order_shows_in_the_bits():
    """The check above can fail: the halves' order and the plain chunk order differ."""
    x, w = randn((5, 1024), "float32", "cpu", seed=1), randn((24, 1024), "float32", "cpu", seed=2)
    assert not torch.equal(matmul.reduce_chunks(x, w, None, 8, 2),
                           matmul.reduce_chunks(x, w, None, 8, 1))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_pair_added_by_all_reduce_gives_the_canonical_bits(dtype):
    """Two ranks' terms added by any all-reduce (an fp32 addition in either order), then the
    bias from zero: the canonical bits, signed zeros included."""
    layout = term_layout(8, 2)
    assert layout.paired and not term_layout(8, 4).paired and not term_layout(3, 3).paired
    x, w = randn((5, 1024), dtype, "cpu", seed=1), randn((24, 1024), dtype, "cpu", seed=2)
    b = randn((24,), dtype, "cpu", seed=3)
    halves = [rank_terms(x[:, r * 512:(r + 1) * 512], w[:, r * 512:(r + 1) * 512], layout, r)[0]
              for r in range(2)]
    halves[0][0, :4], halves[1][0, :4] = -0.0, torch.tensor([-0.0, 0.0, 1.0, -1.0])
    for bias in (b, None):
        canonical = add_terms(torch.stack(halves).unsqueeze(1), bias, x.dtype, layout)
        for total in (halves[0] + halves[1], halves[1] + halves[0]):
            out = add_pair(total, bias, x.dtype)
            assert_exact(out, canonical)
            assert torch.equal(out.float().signbit(), canonical.float().signbit())


def test_tp_sum_mode_is_checked(monkeypatch):
    from parashift.deterministic.reduction import tp_sum_mode
    monkeypatch.setenv("PARASHIFT_DETERMINISTIC_TP_SUM", "chain")
    with pytest.raises(ValueError, match="must be one of"):
        tp_sum_mode()
