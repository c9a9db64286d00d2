"""One rank's rounds (parallel/peer_reshard.py) on a group of itself: host reads of
strided boxes (a column shard of a row-major matrix) land through the landing buffer,
split along the first dim when their byte extent exceeds it, and write exactly the box; local
copies go through the send buffer; zeros zero. A host copy that keeps only the bytes the
transfers read gives the same. No peer, so no process group is asked."""
import pytest
import torch

from parashift.parallel.arena_layout import PlacedParam
from parashift.parallel.host_copy import HostCopy
from parashift.parallel.peer_reshard import PeerReshard, side_view
from parashift.parallel.reshard_schedule import Side, Transfer

ROWS, COLS = 12, 10
PARAM = PlacedParam("w", 0, (ROWS, COLS), 2)
HOST_BASE = 4096  # arena byte of the host copy's first byte
OLD_BASE = 1024  # where the "old plan" keeps a copy of the same matrix


def host_copy() -> torch.Tensor:
    values = torch.arange(ROWS * COLS, dtype=torch.int16).reshape(ROWS, COLS) * 3 + 1
    host = torch.zeros(PARAM.nbytes + 512, dtype=torch.uint8)
    host[:PARAM.nbytes].view(torch.int16).copy_(values.flatten())
    return host


def run(transfers, staging_bytes: int, sparse: bool = False):
    """`sparse`: the host copy keeps only the host transfers' extents."""
    arena = torch.zeros(8192, dtype=torch.uint8)
    host = host_copy()
    arena[OLD_BASE:OLD_BASE + PARAM.nbytes].copy_(host[:PARAM.nbytes])
    whole = HostCopy.whole(host.numel())
    whole.storage.copy_(host)
    reads = [(a - HOST_BASE, b - HOST_BASE) for a, b in (t.dst.extent() for t in transfers
                                                        if t.kind == "host")]
    kept = whole.kept(reads, pin=False) if sparse else whole
    written = PeerReshard(None, 0, torch.device("cpu"), staging_bytes).run(
        [transfers], arena, kept, HOST_BASE)
    return arena, host, written


def matrix(storage: torch.Tensor, base: int) -> torch.Tensor:
    return storage[base:base + PARAM.nbytes].view(torch.int16).view(ROWS, COLS)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("staging_bytes", [4096, 64, 24])
def test_strided_host_reads_write_their_box_only(staging_bytes, sparse):
    """Columns 3..6 of rows 2..10 from the host copy (a 168-byte extent): a 64-byte buffer
    takes it in halves of halves (2-3 rows), a 24-byte one a row at a time (a row's box is
    contiguous, so it goes straight in)."""
    box = ((2, 11), (3, 7))
    side = Side(0, PARAM, HOST_BASE, box)
    assert not side.contiguous()
    arena, host, written = run([Transfer("w", box, side, None)], staging_bytes, sparse)
    got, want = matrix(arena, HOST_BASE), matrix(host, 0)
    expected = torch.zeros_like(want)
    expected[2:11, 3:7] = want[2:11, 3:7]
    assert torch.equal(got, expected)
    assert written["host"] == 9 * 4 * 2
    assert torch.equal(side_view(arena, side), want[2:11, 3:7])


@pytest.mark.parametrize("sparse", [False, True])
def test_local_zero_and_contiguous_host_in_one_round(sparse):
    local = Transfer("w", ((0, 4), (0, 5)), Side(0, PARAM, HOST_BASE, ((0, 4), (0, 5))),
                     Side(0, PARAM, OLD_BASE, ((0, 4), (5, 10))))
    rows = Transfer("w", ((6, 8), (0, 10)), Side(0, PARAM, HOST_BASE, ((6, 8), (0, 10))), None)
    zero = Transfer(None, (), Side(0, PARAM, HOST_BASE, ((10, 12), (0, 10))), None)
    arena, host, written = run([local, rows, zero], 4096, sparse)
    got, want = matrix(arena, HOST_BASE), matrix(host, 0)
    assert torch.equal(got[0:4, 0:5], want[0:4, 5:10])  # read from the old copy's columns
    assert torch.equal(got[6:8], want[6:8])
    assert torch.equal(got[10:12], torch.zeros(2, COLS, dtype=torch.int16))
    assert torch.equal(got[4:6], torch.zeros(2, COLS, dtype=torch.int16))  # untouched
    assert written == {"peer": 0, "local": 40, "host": 40, "zero": 40}
