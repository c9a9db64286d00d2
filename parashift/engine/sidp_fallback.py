"""The sidp policy's start-up check (with `cost_profile` and the workload told, e.g.
`sidp_mean_prompt_tokens`): SiDP's layout holds only DP replicas, so where the cost model
predicts a static plan of the same GPUs (TP, DP x TP, SP...) to serve the workload better,
the engine runs that plan under the static policy instead (a policy never worse than the
plan a user could pick by hand), and says so in its log."""
import dataclasses
import logging

from parashift.config import EngineConfig
from parashift.cost.advisor import step_model_for
from parashift.cost.plan_choice import PlanChoice, choose
from parashift.cost.runs import Engine, Served
from parashift.cost.workload_hint import hint_of
from parashift.designs.sidp import SidpConfig
from parashift.engine.policy.sidp import threshold_for
from parashift.parallel.plan import Plan

logger = logging.getLogger(__name__)


def sidp_choice(config: EngineConfig, hf_config) -> PlanChoice:
    """SiDP over the configured replicas against every static plan of their GPUs."""
    replicas, tp = config.data_parallel_size, config.tensor_parallel_size
    world = replicas * tp
    hint = hint_of(config.sidp)
    sidp = Served.sidp(Plan(dp=replicas, tp=tp), threshold_for(config, hf_config, replicas, tp))
    return choose(step_model_for(config, hf_config, world), [sidp], hint, world,
                  Engine(config.max_num_seqs, config.max_num_batched_tokens or 8192))


def resolve_sidp_fallback(config: EngineConfig, hf_config) -> EngineConfig:
    """The config unchanged, or the best static plan's under the static policy."""
    if config.parallel_policy != "sidp" or not config.sidp.hinted:
        return config
    choice = sidp_choice(config, hf_config)
    logger.info("sidp: the cost model's predictions for the workload told:\n%s",
                choice.report())
    if not choice.static:
        return config
    plan = Plan.parse(choice.best.name)
    logger.warning("sidp: the static plan %s is predicted to serve this workload better than "
                   "SiDP over %d replicas; the static policy runs it", plan.name(),
                   config.data_parallel_size)
    return dataclasses.replace(
        config, parallel_policy="static", sidp=SidpConfig(), data_parallel_size=plan.dp,
        pipeline_parallel_size=plan.pp, sequence_parallel_size=plan.sp,
        tensor_parallel_size=plan.tp)
