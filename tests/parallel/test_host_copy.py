"""A host copy of some byte ranges of a region (parallel/host_copy.py): a box of a
parameter read from a copy keeping only its extent equals the box read from a whole copy,
bytes it does not keep are refused, and its ranges are widened to the arena's alignment."""
import pytest
import torch

from parashift.parallel.arena_layout import ALIGN, PlacedParam
from parashift.parallel.host_copy import HostCopy, merge_extents
from parashift.parallel.reshard_schedule import Side

REGION = 16 * ALIGN
PARAM = PlacedParam("w", 3 * ALIGN, (40, 30), 2)  # int16, 2400 bytes at region byte 768


def whole_copy() -> HostCopy:
    host = HostCopy.whole(REGION)
    host.storage.copy_(torch.randint(0, 256, (REGION,), dtype=torch.uint8))
    return host


def test_merge_extents_widens_to_the_alignment_and_joins_what_touches():
    assert merge_extents([(300, 310), (10, 20), (500, 600), (4000, 4096)], REGION) == [
        (0, 3 * ALIGN), (15 * ALIGN, 16 * ALIGN)]
    assert merge_extents([(5, 5)], REGION) == []


@pytest.mark.parametrize("box", [((2, 11), (3, 7)), ((30, 40), (0, 30)), ((0, 1), (29, 30))])
def test_a_box_from_a_sparse_copy_equals_the_same_box_of_a_whole_one(box):
    whole = whole_copy()
    side = Side(0, PARAM, 5 * ALIGN + PARAM.offset, box)  # the region starts at arena byte 1280
    start, stop = side.extent()
    sparse = whole.kept([(start - 5 * ALIGN, stop - 5 * ALIGN)], pin=False)
    assert sparse.nbytes < whole.nbytes
    got, want = sparse.box(side, 5 * ALIGN), whole.box(side, 5 * ALIGN)
    assert got.dtype == torch.int16 and got.shape == want.shape
    assert torch.equal(got, want)
    matrix = whole.get(PARAM.offset, PARAM.offset + PARAM.nbytes).view(torch.int16).view(40, 30)
    assert torch.equal(want, matrix[tuple(slice(a, b) for a, b in box)])


def test_bytes_not_kept_are_refused():
    sparse = whole_copy().kept([(ALIGN, 2 * ALIGN)], pin=False)
    assert sparse.nbytes == ALIGN and HostCopy.empty().nbytes == 0
    with pytest.raises(KeyError, match="not bytes"):
        sparse.get(ALIGN, 2 * ALIGN + 1)
    with pytest.raises(KeyError, match="not bytes"):
        sparse.get(0, 10)


@pytest.mark.parametrize("given, expected", [
    ("", "pinned_max_round_threshold_mb:64,pinned_max_cached_size_mb:64"),
    ("pinned_max_round_threshold_mb:8", "pinned_max_round_threshold_mb:8")])
def test_pinned_copies_ask_torch_for_exact_sizes_unless_told_otherwise(given, expected):
    """In a fresh process (the setting is the process's): torch's host allocator is told
    not to round pinned buffers above 64 MiB up to a power of two, unless the user said."""
    import os
    import subprocess
    import sys
    code = ("import torch; from parashift.parallel.host_copy import pin_exactly; pin_exactly(); "
            "print(torch._C._accelerator_getAllocatorSettings())")
    env = {**os.environ, "PYTORCH_ALLOC_CONF": given}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == expected
