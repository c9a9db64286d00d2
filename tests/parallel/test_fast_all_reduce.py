"""The symmetric-memory all-reduce: which messages take the one-shot path and which fall
back to dist.all_reduce (CPU, a 2-process gloo group), and, on 2 GPUs, that both paths
sum like dist.all_reduce, eagerly and replayed from a CUDA graph."""
import logging
import os

import pytest
import torch
import torch.distributed as dist

from parashift.parallel import fast_all_reduce
from parashift.parallel.comm_pool import CommunicatorPool
from parashift.parallel.fast_all_reduce import DEFAULT_MAX_BYTES, FastAllReduce, fits
from parashift.parallel.plan import Plan
from tests.helpers.ranks import free_port, run_ranks

DEVICE = os.environ.get("PARASHIFT_TEST_DEVICE", "cpu")  # "cuda": the GPU machine
TWO_GPUS = DEVICE == "cuda" and torch.cuda.is_available() and torch.cuda.device_count() >= 2
HIDDEN = 4096
# (rows, HIDDEN) messages; in bf16 the last two exceed the default 8 MiB buffer in fp32
GPU_ROWS = [1, 16, 256, 1024, 1025]


def spawn_pair(fn, *args) -> None:
    """Runs fn(rank, port, *args) in 2 processes; raises if either fails."""
    run_ranks(fn, 2, free_port(), *args)


def init_group(rank: int, port: int, backend: str) -> None:
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)


def rank_data(shape, rank: int, seed: int, dtype=torch.float32, device="cpu") -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(1000 * seed + rank)
    return torch.randn(shape, generator=g, dtype=dtype, device=device)


def reference(x: torch.Tensor, group=None) -> torch.Tensor:
    want = x.clone()
    dist.all_reduce(want, group=group)
    return want


# ---- which path a message takes (no processes) --------------------------------------
def test_fits_small_messages_on_the_buffer_device():
    buffer = torch.empty(1024, dtype=torch.uint8, device="meta")
    assert fits(torch.empty(512, dtype=torch.bfloat16, device="meta"), buffer)
    assert fits(torch.empty(4, 64, dtype=torch.float32, device="meta"), buffer)


@pytest.mark.parametrize("x", [
    torch.empty(512, dtype=torch.bfloat16),                     # CPU tensor, meta buffer
    torch.empty(257, dtype=torch.float32, device="meta"),       # over the buffer
    torch.empty(8, dtype=torch.float16, device="meta"),         # no one-shot kernel
    torch.empty(3, dtype=torch.bfloat16, device="meta"),        # not a multiple of 4 bytes
    torch.empty(8, 16, dtype=torch.float32, device="meta").t(),  # not contiguous
], ids=["cpu-tensor", "too-large", "float16", "odd-size", "strided"])
def test_falls_back(x):
    assert not fits(x, torch.empty(1024, dtype=torch.uint8, device="meta"))
    assert not fits(x, None)


def test_skipped_off_cuda_and_logged_once(monkeypatch, caplog):
    monkeypatch.setattr(fast_all_reduce, "_logged", set())
    with caplog.at_level(logging.INFO, logger=fast_all_reduce.__name__):
        fasts = [FastAllReduce(None, torch.device("cpu")) for _ in range(3)]
    assert not any(f.available for f in fasts)
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "not CUDA" in caplog.records[0].getMessage()


@pytest.mark.parametrize("value, off", [("1", True), ("0", False), ("", False)])
def test_nccl_p2p_disable_turns_it_off(monkeypatch, value, off):
    """PCIe-like runs on NVLink GPUs (NCCL_P2P_DISABLE=1): one-shot reads of the peer's
    memory would still cross NVLink, so every all-reduce goes to NCCL."""
    monkeypatch.setenv("NCCL_P2P_DISABLE", value)
    reason = fast_all_reduce._unavailable_reason(None, torch.device("cpu"))
    assert (reason == "NCCL_P2P_DISABLE is set") == off
    assert off or "not CUDA" in reason


# ---- a real 2-process gloo group ----------------------------------------------------
def _gloo_worker(rank: int, port: int) -> None:
    torch.set_num_threads(1)
    init_group(rank, port, "gloo")
    fast = FastAllReduce(dist.group.WORLD, torch.device("cpu"), max_bytes=1024)
    assert not fast.available
    for seed, numel in enumerate([1, 255, 256, 4096]):  # below, at and above 1 KiB
        x = rank_data(numel, rank, seed)
        assert torch.equal(fast.all_reduce(x.clone()), reference(x))

    fast.buffer = torch.empty(1024, dtype=torch.uint8, device="meta")  # CUDA-like: elsewhere
    x = rank_data(64, rank, seed=7)
    assert torch.equal(fast.all_reduce(x.clone()), reference(x))  # CPU tensor: gloo

    fast.buffer = torch.empty(1024, dtype=torch.uint8)
    x = rank_data(257, rank, seed=8)
    assert torch.equal(fast.all_reduce(x.clone()), reference(x))  # too large: gloo
    with pytest.raises(NotImplementedError):  # what fits goes to the one-shot op (no CPU kernel)
        fast.all_reduce(rank_data(256, rank, seed=9))

    plan = Plan(tp=2)
    pool = CommunicatorPool(rank, 2, [plan])
    pool.enable_fast_all_reduce(torch.device("cpu"))
    tp = pool.state_for(plan).tp
    assert tp.fast is None
    x = rank_data(32, rank, seed=10)
    assert torch.equal(tp.all_reduce(x.clone()), reference(x, tp.group))
    dist.destroy_process_group()


def test_fallback_in_a_gloo_group_sums_like_all_reduce():
    spawn_pair(_gloo_worker)


# ---- 2 GPUs: the one-shot path against NCCL -----------------------------------------
def _cuda_setup(rank: int, port: int) -> tuple[FastAllReduce, torch.device]:
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    init_group(rank, port, "nccl")
    fast = FastAllReduce(dist.group.WORLD, device)
    assert fast.available, "symmetric memory could not be set up (see the log)"
    return fast, device


def _cuda_eager_worker(rank: int, port: int) -> None:
    fast, device = _cuda_setup(rank, port)
    for dtype in (torch.bfloat16, torch.float32):
        for seed, rows in enumerate(GPU_ROWS):
            x = rank_data((rows, HIDDEN), rank, seed, dtype, device)
            sent = x.clone()
            got = fast.all_reduce(sent)
            assert (got is not sent) == (x.nbytes <= DEFAULT_MAX_BYTES)  # which path ran
            torch.testing.assert_close(got, reference(x), rtol=0, atol=0)
    for seed in range(20):  # back to back: each call reuses the buffer
        x = rank_data((8, HIDDEN), rank, seed, torch.bfloat16, device)
        torch.testing.assert_close(fast.all_reduce(x.clone()), reference(x), rtol=0, atol=0)
    dist.destroy_process_group()


def _check_graph(fast: FastAllReduce, rank: int, dtype: torch.dtype, device) -> None:
    """One graph of all-reduces over every GPU_ROWS size (fast and fallback), replayed
    on new data. The graph is freed on return: destroy_process_group hangs while a
    graph that captured NCCL calls is alive."""
    inputs = [torch.zeros(rows, HIDDEN, dtype=dtype, device=device) for rows in GPU_ROWS]
    for x in inputs:  # warm up outside the graph
        fast.all_reduce(x.clone())
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = [fast.all_reduce(x) for x in inputs]
    for seed in range(3):
        wants = []
        for x in inputs:
            x.copy_(rank_data(x.shape, rank, seed, dtype, device))
            wants.append(reference(x))
        graph.replay()
        for got, want in zip(outputs, wants):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def _cuda_graph_worker(rank: int, port: int) -> None:
    fast, device = _cuda_setup(rank, port)
    for dtype in (torch.bfloat16, torch.float32):
        _check_graph(fast, rank, dtype, device)
    dist.destroy_process_group()


@pytest.mark.skipif(not TWO_GPUS, reason="needs PARASHIFT_TEST_DEVICE=cuda and 2 GPUs")
def test_gpu_one_shot_matches_nccl_eager():
    spawn_pair(_cuda_eager_worker)


@pytest.mark.skipif(not TWO_GPUS, reason="needs PARASHIFT_TEST_DEVICE=cuda and 2 GPUs")
def test_gpu_one_shot_matches_nccl_in_a_cuda_graph():
    spawn_pair(_cuda_graph_worker)
