"""Host lists to device tensors without stalling the host. A copy from pageable memory
waits for the stream to drain, which would serialise the host with the step already
running on the GPU (async scheduling); from pinned memory it is queued like a kernel."""
import torch


def upload(values, dtype: torch.dtype | None, device: torch.device) -> torch.Tensor:
    t = torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t
