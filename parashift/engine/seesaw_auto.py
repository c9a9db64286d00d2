"""`--prefill-plan auto` resolved at start-up: the seesaw cost model (policy/seesaw_cost.py)
over this machine's probed rates (hardware_probe.py) picks a (prefill, decode) pair, or a
static plan that the engine then runs under the static policy where no pair pays."""
import dataclasses
import logging

import torch

from parashift.config import EngineConfig
from parashift.cost.advisor import load_profiles
from parashift.designs.seesaw import AUTO_PLAN, AUTO_PLAN_FIELDS, SeesawConfig
from parashift.engine.hardware_probe import probe_hardware
from parashift.engine.policy.seesaw_cost import (Choice, Hardware, ModelShape, Workload,
                                                  choose_plans)
from parashift.kv.cpu_tier import TierShape
from parashift.quantization import kv_cache_torch_dtype

logger = logging.getLogger(__name__)

DEFAULT_MEAN_PROMPT_TOKENS = 1024  # vLLM's benchmark lengths
DEFAULT_MEAN_OUTPUT_TOKENS = 128


def ranks_per_group(config: EngineConfig, device: torch.device) -> int:
    """auto:<N>'s N, or every GPU of the node split among the data-parallel groups."""
    named = AUTO_PLAN.fullmatch(config.seesaw.prefill_plan).group(1)
    if named is not None:
        return int(named)
    if device.type != "cuda":
        raise ValueError("prefill_plan='auto' on the CPU needs the ranks per group: "
                         "e.g. prefill_plan='auto:2'")
    devices = (config.gpus_per_node or torch.cuda.device_count()) * config.nnodes
    if devices < config.data_parallel_size:
        raise ValueError(f"prefill_plan='auto': {devices} GPUs cannot hold "
                         f"{config.data_parallel_size} groups")
    return devices // config.data_parallel_size


def workload_of(config: EngineConfig, hf_config, dtype: torch.dtype) -> Workload:
    shape = TierShape.of_model(hf_config, kv_cache_torch_dtype(config.kv_cache_dtype, dtype))
    tier = shape.tokens_for(config.seesaw.cpu_kv_tokens, config.seesaw.cpu_kv_gib)
    return Workload(config.seesaw.mean_prompt_tokens or DEFAULT_MEAN_PROMPT_TOKENS,
                    config.seesaw.mean_output_tokens or DEFAULT_MEAN_OUTPUT_TOKENS,
                    num_requests=config.seesaw.num_requests, max_num_seqs=config.max_num_seqs,
                    step_tokens=config.max_num_batched_tokens or 8192, tier_tokens=tier)


def choose_for(config: EngineConfig, hf_config, dtype: torch.dtype,
               device: torch.device) -> Choice:
    """Over the cost model's profiles (`cost_profile`), else over rates probed here."""
    world = ranks_per_group(config, device)
    if config.cost_profile is not None and world > 1:
        hardware = Hardware.from_profiles(*load_profiles(config.cost_profile, world))
    else:
        hardware = probe_hardware(device)
        hardware = dataclasses.replace(
            hardware, memory_bytes=hardware.memory_bytes * config.gpu_memory_utilization)
    kv_bytes = kv_cache_torch_dtype(config.kv_cache_dtype, dtype).itemsize
    shape = ModelShape.of_hf(hf_config, dtype.itemsize, 1 if config.quantization == "fp8" else 0,
                             kv_bytes)
    choice = choose_plans(shape, hardware,
                          workload_of(config, hf_config, dtype), world,
                          config.seesaw.resident_weights)
    logger.info("prefill_plan=auto over %d ranks per group (%s link), seconds per request:\n%s",
                world, hardware.link, choice.report())
    return choice


def resolve_auto_plans(config: EngineConfig, hf_config, dtype: torch.dtype,
                       device: torch.device) -> EngineConfig:
    """The config with the chosen plans named; unchanged without prefill_plan='auto'."""
    if config.parallel_policy != "seesaw" or not config.auto_plans:
        return config
    best = choose_for(config, hf_config, dtype, device).best
    cleared = {name: None for name in AUTO_PLAN_FIELDS}
    if not best.static:
        logger.info("prefill_plan=auto: seesaw %s", best.name)
        return dataclasses.replace(config, seesaw=dataclasses.replace(
            config.seesaw, prefill_plan=best.prefill.name(), decode_plan=best.decode.name(),
            **cleared))
    logger.info("prefill_plan=auto: the static plan %s (no seesaw pair beats it); the static "
                "policy runs it", best.name)
    return dataclasses.replace(
        config, parallel_policy="static", seesaw=SeesawConfig(),
        data_parallel_size=config.data_parallel_size * best.prefill.dp,
        pipeline_parallel_size=best.prefill.pp, tensor_parallel_size=best.prefill.tp)
