"""What the engine resolves at start-up from its config and the model."""
from types import SimpleNamespace

import pytest
import torch

from parashift.config import EngineConfig
from parashift.engine import startup
from parashift.engine.startup import (is_large_gpu, resolve_device, resolve_dtype,
                                      resolve_max_model_len, with_step_budget)


def test_the_context_limit_is_the_models_or_its_sliding_window():
    model = SimpleNamespace(max_position_embeddings=4096, sliding_window=1024,
                            use_sliding_window=True)
    assert resolve_max_model_len(EngineConfig(), model) == 1024
    model.use_sliding_window = False
    assert resolve_max_model_len(EngineConfig(), model) == 4096
    assert resolve_max_model_len(EngineConfig(max_model_len=512), model) == 512
    with pytest.raises(ValueError, match=r"max_model_len=8192 exceeds .* \(4096\)"):
        resolve_max_model_len(EngineConfig(max_model_len=8192), model)


def test_the_step_budget_by_device_and_half_of_it_per_request():
    cpu = with_step_budget(EngineConfig(), torch.device("cpu"))
    assert (cpu.max_num_batched_tokens, cpu.long_prefill_token_threshold) == (512, 256)
    cuda = with_step_budget(EngineConfig(), torch.device("cuda"))
    assert (cuda.max_num_batched_tokens, cuda.long_prefill_token_threshold) == (8192, 4096)
    offline_cpu = with_step_budget(EngineConfig(), torch.device("cpu"), offline=True)
    assert (offline_cpu.max_num_batched_tokens, offline_cpu.long_prefill_token_threshold) == \
        (2048, 1024)
    given = with_step_budget(EngineConfig(max_num_batched_tokens=100,
                                          long_prefill_token_threshold=0), torch.device("cpu"))
    assert (given.max_num_batched_tokens, given.long_prefill_token_threshold) == (100, 0)


@pytest.mark.parametrize("gpu, offline, budget", [
    (("NVIDIA H200", 140 * 2**30), True, 16384),
    (("NVIDIA H200", 140 * 2**30), False, 8192),  # a server keeps its inter-token bound
    (("NVIDIA H100 80GB HBM3", 79 * 2**30), True, 16384),
    (("NVIDIA A100-SXM4-80GB", 79 * 2**30), True, 8192),
    (("NVIDIA L40S", 44 * 2**30), True, 8192),
])
def test_the_offline_llm_takes_a_larger_budget_on_large_gpus(monkeypatch, gpu, offline, budget):
    monkeypatch.setattr(startup, "gpu_name_and_bytes", lambda device: gpu)
    cuda = torch.device("cuda")
    config = with_step_budget(EngineConfig(), cuda, offline)
    assert (config.max_num_batched_tokens, config.long_prefill_token_threshold) == \
        (budget, budget // 2)
    given = with_step_budget(EngineConfig(max_num_batched_tokens=4096), cuda, offline)
    assert given.max_num_batched_tokens == 4096


def test_a_large_gpu_is_70_gib_and_not_an_a100():
    assert is_large_gpu("NVIDIA H100", 70 * 2**30)
    assert not is_large_gpu("NVIDIA H100", 70 * 2**30 - 1)
    assert not is_large_gpu("nvidia a100 80gb", 80 * 2**30)


def test_auto_dtype_follows_the_device_and_the_model():
    half = SimpleNamespace(torch_dtype="float16")
    assert resolve_dtype("auto", half, torch.device("cpu")) is torch.float32
    assert resolve_dtype("auto", half, torch.device("cuda")) is torch.float16
    assert resolve_dtype("auto", SimpleNamespace(), torch.device("cuda")) is torch.bfloat16
    assert resolve_dtype("bfloat16", half, torch.device("cpu")) is torch.bfloat16


def test_auto_device_is_the_cpu_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine: auto picks it")
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="no CUDA device"):
        resolve_device("cuda")
