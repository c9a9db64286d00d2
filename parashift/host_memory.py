"""What the host can give: available RAM (MemAvailable) and room in /dev/shm. Start-up
checks its host buffers against them (the CPU KV tier, pinned weight copies) and refuses,
naming what does not fit, instead of dying later in the kernel's OOM killer."""
import os

SHM_DIR = "/dev/shm"


def mem_available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo, or None where the file is absent (not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def shm_free_bytes() -> int | None:
    try:
        stats = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def check_host_memory(needs: dict[str, int], shared: int = 0, advice: str = "") -> None:
    """Refuses (ValueError) when the buffers in `needs` (name -> bytes) exceed the host's
    available memory, or when `shared` of those bytes exceed /dev/shm's free room; the
    message ends with `advice` (what to lower)."""
    total = sum(needs.values())
    listing = ", ".join(f"{name} {n / 2**30:.2f} GiB" for name, n in needs.items())
    available = mem_available_bytes()
    if available is not None and total > available:
        raise ValueError(f"host memory cannot hold {listing} ({total / 2**30:.2f} GiB in all): "
                         f"{available / 2**30:.2f} GiB available{advice}")
    free = shm_free_bytes()
    if shared and free is not None and shared > free:
        raise ValueError(f"{SHM_DIR} cannot hold {shared / 2**30:.2f} GiB of shared buffers "
                         f"({free / 2**30:.2f} GiB free; a container's --shm-size limits it){advice}")
