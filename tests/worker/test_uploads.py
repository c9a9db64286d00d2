"""The staging ring: every pack comes back as it was written, through growth and slot
reuse, on the CPU and (where there is one) on a GPU, where the copies are queued
behind other work."""
import numpy as np
import pytest
import torch

from parashift.uploads import MAX_LAYOUTS, StagingRing, pack_offsets

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_packs_come_back_intact_through_growth_and_reuse(device):
    ring = StagingRing(torch.device(device), depth=3, initial_bytes=16)
    kept = []
    for k in range(40):
        if device == "cuda":  # keep the stream busy so that copies queue behind it
            torch.cuda._sleep(100_000)
        a = np.arange(k * 7 % 13 + 50 * (k % 5 == 0)) + k
        b = np.arange(6).reshape(2, 3) * k
        x, y, z = ring.upload([(a, torch.int64), (b, torch.int32), ([k, k + 1], torch.int64)])
        assert (x.dtype, y.dtype, tuple(y.shape)) == (torch.int64, torch.int32, (2, 3))
        kept.append((a, x))
        kept = kept[-ring.depth:]  # a view stays valid until its slot comes round again
        for values, tensor in kept:
            assert tensor.cpu().tolist() == values.tolist()
        assert y.cpu().tolist() == b.tolist() and z.cpu().tolist() == [k, k + 1]


def test_empty_arrays():
    ring = StagingRing(torch.device("cpu"))
    x, y = ring.upload([(np.zeros(0, np.int64), torch.int64), ([], torch.int32)])
    assert x.numel() == 0 and y.numel() == 0 and y.dtype == torch.int32


def test_a_pack_into_a_given_buffer_lands_at_its_offsets():
    """`into`: the pack is copied to the caller's buffer, each array where `pack_offsets`
    puts it, and the returned tensors are views of that buffer; a pack that does not fit
    is refused."""
    ring = StagingRing(torch.device("cpu"))
    into = torch.zeros(256, dtype=torch.uint8)
    a, b, c = np.arange(3), np.arange(6, dtype=np.int32).reshape(2, 3), [True, False]
    x, y, z = ring.upload([(a, torch.int64), (b, torch.int32), (c, torch.bool)], into=into)
    offsets, total = pack_offsets([24, 24, 2])
    assert (offsets, total) == ([0, 24, 48], 56)
    for tensor, start in zip((x, y, z), offsets):
        assert tensor.data_ptr() - into.data_ptr() == start
    assert into[:24].view(torch.int64).tolist() == [0, 1, 2]
    assert y.tolist() == b.tolist() and z.tolist() == c
    with pytest.raises(ValueError, match="does not fit"):
        ring.upload([(np.arange(40), torch.int64)], into=into)


def test_layouts_and_their_views_are_made_once_and_kept_bounded():
    """The same layout in the same slot gives the same views; layouts of ever new shapes
    (eager steps) do not accumulate without end."""
    ring = StagingRing(torch.device("cpu"), depth=2)
    first, _ = ring.reserve([((3,), torch.int64), ((2, 2), torch.int32)])
    ring.send()
    ring.reserve([((5,), torch.int64)])
    ring.send()
    again, _ = ring.reserve([((3,), torch.int64), ((2, 2), torch.int32)])
    ring.send()
    assert all(a is b for a, b in zip(first, again))
    for n in range(20 * MAX_LAYOUTS):
        ring.reserve([((n,), torch.int64)])
        ring.send()
    assert len(ring.layouts) <= 16 * MAX_LAYOUTS + 1
    assert all(len(views) <= MAX_LAYOUTS + 1 for views in ring.views)


def test_preallocated_slots_take_a_pack_of_that_size_without_growing():
    ring = StagingRing(torch.device("cpu"), depth=3)
    ring.preallocate(1 << 17)
    buffers = [ring.host[slot] for slot in range(ring.depth)]
    assert all(b is not None and b.numel() >= 1 << 17 for b in buffers)
    for k in range(2 * ring.depth):
        x, = ring.upload([(np.arange(16000) + k, torch.int64)])  # 128,000 bytes
        assert x[0].item() == k
    assert all(ring.host[slot] is buffers[slot] for slot in range(ring.depth))


def test_a_step_pack_of_a_long_prompt_is_sized_as_build_step_inputs_lays_it_out():
    from parashift.worker.step_inputs import step_pack_bytes
    # tokens, positions, slots (int64), 2 query starts, 1 length, 257 table entries (int32)
    assert step_pack_bytes(4096, 1, 257) == 3 * 8 * 4096 + 8 + 8 + 4 * 257 + 4
