"""What the engine resolves at start-up from its config and the model: the device, the
dtype, the context limit, the step budget, the tokenizer, the request defaults and the end
tokens."""
import dataclasses
import logging

import torch

from parashift.config import EngineConfig
from parashift.loader.chat_template import load_chat_template
from parashift.loader.generation_config import generation_defaults as model_generation_defaults
from parashift.loader.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)


def make_tokenizer(config: EngineConfig, source):
    if config.skip_tokenizer_init:
        if config.chat_template is not None:
            raise ValueError("chat_template needs a tokenizer; drop skip_tokenizer_init")
        return None
    tokenizer = load_tokenizer(source, config.tokenizer, config.trust_remote_code)
    if config.chat_template is not None:
        tokenizer.chat_template = load_chat_template(config.chat_template)
    return tokenizer


def request_defaults(source, setting: str) -> dict:
    """Request defaults from the generation config; logged once, as vLLM does."""
    defaults = model_generation_defaults(source, setting)
    if defaults:
        logger.info("Request defaults from the model's generation config (unset fields of a "
                    "request take them; --generation-config vllm ignores it): %s", defaults)
    return defaults


# A step's token budget, when not given. On the CPU a long prompt's step blocks every other
# request for its whole duration: SmolLM2 prefill steps of 512 tokens took 1-2.5 s on two busy
# cores, one of 4096 tokens 18 s (2026-11-23). GPUs: 8192, and vLLM's 16384 for the offline
# `LLM` on GPUs of >= 70 GiB other than the A100 (its EngineArgs.get_batch_defaults): on two
# H200s TP=2 ran `chat` 4% faster at 16384 than at 8192, DP=2 `summarize` as fast
# (docs/benchmark_log.md). A server keeps 8192: its steps bound every stream's inter-token time.
# The offline `LLM` on the CPU: 2048, so that a batch of prompts is one step, not several
# with decodes beside chunks and requests that end a step apart (16 prompts of 64 tokens at
# 512: 66 forwards for 64 tokens each, the last two of 8 and 1 rows that read every weight).
CPU_STEP_TOKENS, CPU_OFFLINE_STEP_TOKENS = 512, 2048
GPU_STEP_TOKENS, LARGE_GPU_OFFLINE_STEP_TOKENS = 8192, 16384
LARGE_GPU_BYTES = 70 * 2**30


def default_step_tokens(device: torch.device, offline: bool) -> int:
    if device.type == "cpu":
        return CPU_OFFLINE_STEP_TOKENS if offline else CPU_STEP_TOKENS
    if device.type == "cuda" and offline and is_large_gpu(*gpu_name_and_bytes(device)):
        return LARGE_GPU_OFFLINE_STEP_TOKENS
    return GPU_STEP_TOKENS


def is_large_gpu(name: str, total_bytes: int) -> bool:
    return total_bytes >= LARGE_GPU_BYTES and "A100" not in name.upper()


def gpu_name_and_bytes(device: torch.device) -> tuple[str, int]:
    properties = torch.cuda.get_device_properties(device)
    return properties.name, properties.total_memory


def with_step_budget(config: EngineConfig, device: torch.device,
                     offline: bool = False, max_model_len: int | None = None) -> EngineConfig:
    """The budget (`offline`: for the `LLM` class, not a server), and a per-request cap of
    half of it by default, so that one long prompt leaves half of every step to the requests
    behind it (they wait one step, not its whole prefill). Without chunked prefill a step
    holds the longest prompt whole, and no cap."""
    if not config.enable_chunked_prefill:
        return whole_prefill_budget(config, device, offline, max_model_len)
    budget = config.max_num_batched_tokens or default_step_tokens(device, offline)
    cap = config.long_prefill_token_threshold
    return dataclasses.replace(config, max_num_batched_tokens=budget,
                               long_prefill_token_threshold=max(1, budget // 2) if cap is None else cap)


def whole_prefill_budget(config: EngineConfig, device: torch.device, offline: bool,
                         max_model_len: int | None) -> EngineConfig:
    """enable_chunked_prefill=False (vLLM's --no-enable-chunked-prefill): the budget holds a
    prompt of max_model_len tokens (by default the larger of the two), and no prompt is cut."""
    longest = max_model_len or config.max_model_len or 0
    budget = config.max_num_batched_tokens or max(longest, default_step_tokens(device, offline))
    if budget < longest:
        raise ValueError(f"max_num_batched_tokens ({budget}) is smaller than max_model_len "
                         f"({longest}): without chunked prefill a step must hold a whole "
                         "prompt; raise --max-num-batched-tokens, lower --max-model-len or "
                         "enable chunked prefill")
    return dataclasses.replace(config, max_num_batched_tokens=budget,
                               long_prefill_token_threshold=0)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but no CUDA device is available")
    return torch.device(device)


def resolve_dtype(dtype: str, hf_config, device: torch.device) -> torch.dtype:
    if dtype != "auto":
        return getattr(torch, dtype)
    if device.type == "cpu":
        return torch.float32
    declared = getattr(hf_config, "torch_dtype", None) or getattr(hf_config, "dtype", None)
    return torch.float16 if declared in (torch.float16, "float16") else torch.bfloat16


def resolve_max_model_len(config: EngineConfig, hf_config) -> int:
    limit = getattr(hf_config, "max_position_embeddings", None) or 2048
    window = getattr(hf_config, "sliding_window", None)
    uses_window = getattr(hf_config, "use_sliding_window", True)
    if window and uses_window and window < limit:
        limit = window  # beyond the window the model needs sliding-window attention
    if config.max_model_len is None:
        return limit
    if config.max_model_len > limit:
        raise ValueError(f"max_model_len={config.max_model_len} exceeds what the model supports ({limit})")
    return config.max_model_len


def eos_token_ids(hf_config, tokenizer, source) -> set[int]:
    ids: set[int] = set()
    for value in (getattr(hf_config, "eos_token_id", None),
                  getattr(tokenizer, "eos_token_id", None) if tokenizer else None):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(value)
    if source.kind == "hf" and (source.path / "generation_config.json").exists():
        from transformers import GenerationConfig
        eos = GenerationConfig.from_pretrained(source.path).eos_token_id
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    return ids
