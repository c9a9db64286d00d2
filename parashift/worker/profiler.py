"""torch.profiler on a rank, between `LLM.start_profile()` and `LLM.stop_profile()` (vLLM's
calls): each rank writes a Chrome trace of its own (`rank<N>.trace.json` in the trace folder)
and answers with the time of its operations by name, the device's where there is one (CUDA
kernels, NCCL's included), the host's otherwise. A multi-rank plan's steps run in the worker
processes, which a profiler in the engine's process does not see."""
import os
import re

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


class RankProfiler:
    def __init__(self, rank: int, device: torch.device):
        self.rank, self.device = rank, device
        self._profile = None
        self._trace_dir = None

    def start(self, trace_dir: str | None) -> None:
        if self._profile is not None:
            raise RuntimeError(f"rank {self.rank}: a profile is already running")
        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._trace_dir = trace_dir
        self._profile = profile(activities=activities)
        self._profile.__enter__()

    def stop(self, top: int = 30) -> dict:
        """{"rank", "trace" (its path or None), "device_ms" | "host_ms": [(name, ms, calls),
        ...] with the `top` operations by their own time, most first, "busy_ms": the
        profile's span and the time the host and the device were busy in it}."""
        if self._profile is None:
            raise RuntimeError(f"rank {self.rank}: no profile is running (start_profile first)")
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        prof, self._profile = self._profile, None
        prof.__exit__(None, None, None)
        trace = None
        if self._trace_dir is not None:
            os.makedirs(self._trace_dir, exist_ok=True)
            trace = os.path.join(self._trace_dir, f"rank{self.rank}.trace.json")
            prof.export_chrome_trace(trace)
        on_device = self.device.type == "cuda"
        times = {}
        for event in prof.key_averages():
            us = event.self_device_time_total if on_device else event.self_cpu_time_total
            if us > 0:
                ms, calls = times.get(event.key, (0.0, 0))
                times[event.key] = (ms + us / 1e3, calls + event.count)
        ranked = sorted(times.items(), key=lambda item: -item[1][0])[:top]
        return {"rank": self.rank, "trace": trace,
                "device_ms" if on_device else "host_ms":
                    [(name, round(ms, 4), calls) for name, (ms, calls) in ranked],
                "busy_ms": busy_times(prof.events()),
                "runtime_calls": runtime_calls(prof.key_averages())}


def busy_times(events) -> dict:
    """The span from the first operation to the last, and the time the host (its operator
    calls) and the device (its kernels; and without the collectives', which wait for the
    slowest rank) were busy in it, ms. A step whose host is busy about as long as the
    device's span is bound by its launches, not by its kernels."""
    host, device, compute = [], [], []
    for event in events:
        interval = (event.time_range.start, event.time_range.end)
        if event.device_type == DeviceType.CPU:
            host.append(interval)
        else:
            device.append(interval)
            if not any(word in event.name.lower() for word in COLLECTIVE_WORDS):
                compute.append(interval)
    everything = host + device
    span = max(e for _, e in everything) - min(s for s, _ in everything) if everything else 0
    return {"span": round(span / 1e3, 3), "host": round(covered_us(host) / 1e3, 3),
            "device": round(covered_us(device) / 1e3, 3),
            "device_without_collectives": round(covered_us(compute) / 1e3, 3)}


def runtime_calls(averages, top: int = 10) -> list[tuple[str, float, int]]:
    """The CUDA runtime and driver calls by host time, most first: (name, ms, calls). A
    synchronize or a blocking copy among them is a step waiting for its device; launches,
    what each kernel costs the host."""
    calls = [(event.key, round(event.self_cpu_time_total / 1e3, 4), event.count)
             for event in averages if RUNTIME_CALL.match(event.key)]
    return sorted(calls, key=lambda call: -call[1])[:top]


RUNTIME_CALL = re.compile(r"^cu(da)?[A-Z]")
COLLECTIVE_WORDS = ("nccl", "all_reduce", "allreduce", "all_gather", "allgather",
                    "reduce_scatter", "all_to_all", "alltoall", "multimem")


def covered_us(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of the (start, end) intervals."""
    covered, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            covered += end - max(start, reach)
            reach = end
    return covered
