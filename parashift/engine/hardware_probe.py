"""The rates the seesaw cost model reads (policy/seesaw_cost.py's Hardware), measured once per
machine in a few seconds and cached as JSON: device copy bandwidth (HBM), a bf16 matmul's
rate, pinned host->device copies (weights, and the CPU KV tier: workers page-lock its
shared-memory file, kv/cpu_tier.py) and, where two GPUs reach each other directly, one peer
copy. An all-reduce is not run (it needs the ranks' process group): its bus bandwidth is the peer copy's rate,
or a default per link kind where there is none. On the CPU the sizes are tiny (well under
a second) and the links are defaults.

Cache: $PARASHIFT_CACHE_DIR (default ~/.cache/parashift)/probe-<device>-x<count>.json;
delete it to measure again, or edit it to model another machine."""
import json
import logging
import os
import re
import time
from dataclasses import asdict
from pathlib import Path

import torch

from parashift.engine.policy.seesaw_cost import Hardware
from parashift.parallel.topology import peer_access_disabled

logger = logging.getLogger(__name__)

# bytes/s where nothing is measured: an all-reduce through the host (NCCL_P2P_DISABLE=1 or
# no peer access) and gloo over loopback on the CPU
HOST_ALL_REDUCE_BYTES_PER_S = 10e9
CPU_LINK_BYTES_PER_S = 5e9


def cache_dir() -> Path:
    return Path(os.environ.get("PARASHIFT_CACHE_DIR") or Path.home() / ".cache" / "parashift")


def _cache_path(device: torch.device) -> Path:
    if device.type == "cuda":
        name = f"{torch.cuda.get_device_name(device)}-x{torch.cuda.device_count()}"
        name += "-nop2p" if peer_access_disabled() else ""
    else:
        name = "cpu"
    return cache_dir() / f"probe-{re.sub(r'[^A-Za-z0-9.-]+', '_', name)}.json"


def probe_hardware(device: torch.device) -> Hardware:
    """The cached rates of this machine, measured (and cached) where there are none."""
    path = _cache_path(device)
    try:
        hardware = Hardware(**json.loads(path.read_text()))
        logger.info("hardware rates from %s", path)
        return hardware
    except (OSError, ValueError, TypeError):
        pass
    hardware = _measure_cuda(device) if device.type == "cuda" else _measure_cpu()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(hardware), indent=1))
    except OSError as e:
        logger.warning("could not cache the hardware probe at %s: %s", path, e)
    logger.info("hardware probe: %s", hardware)
    return hardware


def _rate(amount: float, run, sync, repeats: int = 3) -> float:
    """amount / the fastest of a few timed runs (one warm-up)."""
    run()
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        sync()
        best = min(best, time.perf_counter() - start)
    return amount / max(best, 1e-9)


def _copy_rate(src: torch.Tensor, dst: torch.Tensor, sync) -> float:
    """Bytes moved per second, read and write counted where both are on one device."""
    moved = src.nbytes * (2 if src.device == dst.device else 1)
    return _rate(moved, lambda: dst.copy_(src, non_blocking=True), sync)


def _matmul_rate(n: int, dtype: torch.dtype, device: torch.device, sync) -> float:
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    return _rate(2 * n ** 3, lambda: a @ b, sync)


def _measure_cpu() -> Hardware:
    def sync():
        return None
    src, dst = torch.empty(1 << 20, dtype=torch.uint8), torch.empty(1 << 20, dtype=torch.uint8)
    copy = _copy_rate(src, dst, sync)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return Hardware(hbm_bytes_per_s=copy, matmul_flops=_matmul_rate(128, torch.float32,
                                                                    torch.device("cpu"), sync),
                    memory_bytes=memory, all_reduce_bus_bytes_per_s=CPU_LINK_BYTES_PER_S,
                    host_to_device_bytes_per_s=copy / 2, kv_tier_bytes_per_s=copy / 2,
                    peer_bytes_per_s=CPU_LINK_BYTES_PER_S, link="cpu")


def _measure_cuda(device: torch.device) -> Hardware:
    def sync():
        torch.cuda.synchronize(device)
    size = 256 << 20
    on_device = torch.empty(size, dtype=torch.uint8, device=device)
    copy = _copy_rate(on_device, torch.empty_like(on_device), sync)
    pinned = _copy_rate(torch.empty(size, dtype=torch.uint8, pin_memory=True), on_device, sync)
    link, peer = _peer_link(device, on_device, sync)
    return Hardware(hbm_bytes_per_s=copy, matmul_flops=_matmul_rate(8192, torch.bfloat16,
                                                                    device, sync),
                    memory_bytes=torch.cuda.get_device_properties(device).total_memory,
                    all_reduce_bus_bytes_per_s=peer, host_to_device_bytes_per_s=pinned,
                    kv_tier_bytes_per_s=pinned, peer_bytes_per_s=peer, link=link)


def _peer_link(device: torch.device, src: torch.Tensor, sync) -> tuple[str, float]:
    """The link to the next GPU and one copy's rate over it; through the host without P2P."""
    count = torch.cuda.device_count()
    index = device.index or 0
    other = (index + 1) % count
    if count < 2 or peer_access_disabled() or not torch.cuda.can_device_access_peer(index, other):
        return "host", HOST_ALL_REDUCE_BYTES_PER_S
    dst = torch.empty_like(src, device=torch.device("cuda", other))

    def both():
        sync()
        torch.cuda.synchronize(other)
    rate = _copy_rate(src, dst, both)
    return ("nvlink" if rate > 50e9 else "pcie"), rate
