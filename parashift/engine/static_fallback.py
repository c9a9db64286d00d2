"""A policy's start-up check against the static plans (with `cost_profile` and the workload
told, e.g. `sidp_mean_prompt_tokens`, `shift_workload_file`): SiDP's layout holds only DP
replicas, Shift's one SP group per replica, so where the cost model predicts a static plan of
the same GPUs (TP, DP x TP, ...) to serve the workload better (cost/plan_choice.py), the
engine runs that plan under the static policy instead (a policy never worse than the plan a
user could pick by hand), and says so in its log."""
import dataclasses
import logging

from parashift.config import EngineConfig
from parashift.cost.advisor import Advisor, step_model_for
from parashift.cost.plan_choice import PlanChoice, choose
from parashift.cost.runs import Engine, Served
from parashift.cost.step import replica_plan
from parashift.cost.workload_hint import hint_of
from parashift.designs.options import hinted
from parashift.engine.policy.sidp import threshold_for
from parashift.parallel.plan import Plan

logger = logging.getLogger(__name__)


def sidp_served(config: EngineConfig, hf_config) -> Served:
    replicas, tp = config.data_parallel_size, config.tensor_parallel_size
    return Served.sidp(Plan(dp=replicas, tp=tp), threshold_for(config, hf_config, replicas, tp),
                       cas_graphs=config.cuda_graphs is not False)


def shift_served(config: EngineConfig, hf_config) -> Served:
    """Shift over the configured plan at the model's crossover (engine/policy/shift.py)."""
    base = config.plan
    model = step_model_for(config, hf_config, base.world_size)
    threshold = Advisor(model, max_seqs=config.max_num_seqs).shift_threshold(replica_plan(base))
    return Served.shift(base, threshold)


# the policies that fall back: the design's served candidate
DESIGNS = {"sidp": sidp_served, "shift": shift_served}


def design_choice(config: EngineConfig, hf_config) -> PlanChoice:
    """The policy's candidate against every static plan of its GPUs."""
    world = config.plan.world_size
    return choose(step_model_for(config, hf_config, world),
                  [DESIGNS[config.parallel_policy](config, hf_config)],
                  hint_of(getattr(config, config.parallel_policy)), world,
                  Engine(config.max_num_seqs, config.max_num_batched_tokens or 8192))


def resolve_static_fallback(config: EngineConfig, hf_config) -> EngineConfig:
    """The config unchanged, or the best static plan's under the static policy."""
    policy = config.parallel_policy
    if policy not in DESIGNS or not hinted(getattr(config, policy)):
        return config
    choice = design_choice(config, hf_config)
    logger.info("%s: the cost model's predictions for the workload told:\n%s", policy,
                choice.report())
    if not choice.static:
        return config
    plan = Plan.parse(choice.best.name)
    logger.warning("%s: the static plan %s is predicted to serve this workload better than "
                   "%s over %s; the static policy runs it", policy, plan.name(), policy,
                   config.plan.name())
    options = type(getattr(config, policy))()
    return dataclasses.replace(
        config, parallel_policy="static", **{policy: options}, data_parallel_size=plan.dp,
        pipeline_parallel_size=plan.pp, sequence_parallel_size=plan.sp,
        tensor_parallel_size=plan.tp)
