"""`--prefill-plan auto` resolved at start-up: a (prefill, decode) pair, or a static plan that
the engine then runs under the static policy where no pair pays. With `cost_profile` the
step model decides (cost/plan_choice.py, the one cost model the planner and the other
policies use); without one, the roofline of policy/seesaw_cost.py over this machine's probed
rates (hardware_probe.py)."""
import dataclasses
import logging

import torch

from parashift.config import EngineConfig
from parashift.cost.advisor import step_model_for
from parashift.cost.forecast import candidate_name
from parashift.cost.plan_choice import choose
from parashift.cost.runs import Engine
from parashift.cost.workload_hint import DEFAULT_OUTPUT_TOKENS, DEFAULT_PROMPT_TOKENS, hint_of
from parashift.designs.seesaw import AUTO_PLAN, AUTO_PLAN_FIELDS, SeesawConfig
from parashift.engine.hardware_probe import probe_hardware
from parashift.engine.policy.seesaw_cost import PAIR_MARGIN, ModelShape, Workload, choose_plans
from parashift.kv.cpu_tier import TierShape
from parashift.parallel.plan import Plan
from parashift.quantization import kv_cache_torch_dtype

logger = logging.getLogger(__name__)

DEFAULT_MEAN_PROMPT_TOKENS = DEFAULT_PROMPT_TOKENS  # vLLM's benchmark lengths
DEFAULT_MEAN_OUTPUT_TOKENS = DEFAULT_OUTPUT_TOKENS


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
               device: torch.device) -> tuple[Plan, Plan]:
    """(prefill, decode) of the chosen pair, or the chosen static plan twice: from the cost
    model (`cost_profile`), else from the roofline over rates probed here."""
    world = ranks_per_group(config, device)
    if config.cost_profile is not None and world > 1:
        return choose_from_profile(config, hf_config, dtype, world)
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
    return choice.best.prefill, choice.best.decode


def choose_from_profile(config: EngineConfig, hf_config, dtype: torch.dtype,
                        world: int) -> tuple[Plan, Plan]:
    """The step model's choice (cost/plan_choice.py): every static plan of the group's ranks
    and, offline, the PP x TP -> TP pairs (cost/seesaw_run.py), a pair only where it wins by
    PAIR_MARGIN; online (`seesaw_request_rate`) by a request's latency over the static plans."""
    heads = ModelShape.of_hf(hf_config)  # refuses a mixture of experts, as the roofline does
    model = step_model_for(config, hf_config, world)
    hint = hint_of(config.seesaw)
    pairs = {}
    for pp in (d for d in range(2, world + 1) if world % d == 0 and hint.offline):
        prefill, decode = Plan(pp=pp, tp=world // pp), Plan(tp=world)
        try:
            for plan in (prefill, decode):
                heads.check(plan)
        except ValueError:
            continue
        pairs[candidate_name((prefill, decode))] = (prefill, decode)
    tier_tokens = workload_of(config, hf_config, dtype).tier_tokens
    choice = choose(model, list(pairs.values()), hint, world,
                    Engine(config.max_num_seqs, config.max_num_batched_tokens or 8192),
                    PAIR_MARGIN, tier_tokens * model.shape.kv_bytes_per_token / world)
    logger.info("prefill_plan=auto over %d ranks per group, the cost model's predictions "
                "(%s):\n%s", world, "offline" if hint.offline else
                f"online at {hint.request_rate:g} req/s", choice.report())
    if choice.static:
        plan = Plan.parse(choice.best.name)
        return plan, plan
    return pairs[choice.best.name]


def resolve_auto_plans(config: EngineConfig, hf_config, dtype: torch.dtype,
                       device: torch.device) -> EngineConfig:
    """The config with the chosen plans named; unchanged without prefill_plan='auto'."""
    if config.parallel_policy != "seesaw" or not config.auto_plans:
        return config
    prefill, decode = choose_for(config, hf_config, dtype, device)
    cleared = {name: None for name in AUTO_PLAN_FIELDS}
    if prefill != decode:
        logger.info("prefill_plan=auto: seesaw %s->%s", prefill.name(), decode.name())
        return dataclasses.replace(config, seesaw=dataclasses.replace(
            config.seesaw, prefill_plan=prefill.name(), decode_plan=decode.name(), **cleared))
    logger.info("prefill_plan=auto: the static plan %s (no seesaw pair beats it); the static "
                "policy runs it", prefill.name())
    return dataclasses.replace(
        config, parallel_policy="static", seesaw=SeesawConfig(),
        data_parallel_size=config.data_parallel_size * prefill.dp,
        pipeline_parallel_size=prefill.pp, sequence_parallel_size=prefill.sp,
        tensor_parallel_size=prefill.tp)
