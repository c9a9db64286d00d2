"""The `generate` and `plan` commands of the `parashift` command line (parashift/cli.py)."""
import argparse
import dataclasses
import json
import logging

from parashift.entrypoints.engine_args import add_engine_args, engine_config_from_args
from parashift.entrypoints.help_format import DefaultsOnceFormatter

logger = logging.getLogger(__name__)

# What `generate` uses for a sampling option given neither on the command line nor by the
# model's generation config (SamplingParams' own defaults for the others).
GENERATE_DEFAULTS = {"temperature": 0.0, "max_tokens": 256}
MODEL_DEFAULT = "default: the model's generation config, else "


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sampling")
    group.add_argument("--temperature", type=float, default=None,
                       help=f"{MODEL_DEFAULT}0 = greedy")
    group.add_argument("--top-p", type=float, default=None, help=f"{MODEL_DEFAULT}1.0")
    group.add_argument("--top-k", type=int, default=None, help=f"-1 = off ({MODEL_DEFAULT}-1)")
    group.add_argument("--min-p", type=float, default=None, help=f"{MODEL_DEFAULT}0.0")
    group.add_argument("--sampling-seed", type=int, default=None, help="per-request seed")
    group.add_argument("--max-tokens", type=int, default=None, help=f"{MODEL_DEFAULT}256")
    group.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    group.add_argument("--stop-token-ids", type=int, nargs="*", default=None)
    group.add_argument("--ignore-eos", action="store_true")
    group.add_argument("--logprobs", type=int, default=None, help="top-k logprobs per token")


def sampling_params_from_args(args, model_defaults: dict | None = None):
    """The options given, over the model's generation config, over GENERATE_DEFAULTS."""
    from parashift.sampling_params import SamplingParams
    given = {name: getattr(args, name) for name in ("temperature", "top_p", "top_k", "min_p",
                                                    "max_tokens")
             if getattr(args, name) is not None}
    return SamplingParams(**{**GENERATE_DEFAULTS, **(model_defaults or {}), **given},
                          seed=args.sampling_seed, stop=args.stop,
                          stop_token_ids=args.stop_token_ids, ignore_eos=args.ignore_eos,
                          logprobs=args.logprobs)


def add_generate_args(subparsers) -> None:
    p = subparsers.add_parser("generate", help="generate completions for prompts",
                              formatter_class=DefaultsOnceFormatter,
                              description="Generate text for prompts given as arguments or "
                                          "in a JSONL file ({\"prompt\": ...} per line).")
    p.add_argument("prompts", nargs="*", help="prompts (each one request)")
    p.add_argument("--input-file", help="JSONL file with a 'prompt' (text or token ids) or "
                                        "'messages' (chat) per line")
    p.add_argument("--output-file", help="write results as JSONL here instead of stdout")
    p.add_argument("--no-chat-template", dest="use_chat_template", action="store_false",
                   help="send prompts raw instead of as a user message in the chat template")
    add_engine_args(p)
    add_sampling_args(p)
    p.set_defaults(func=run_generate)


def _load_requests(args) -> list:
    requests = [{"prompt": p} for p in args.prompts]
    if args.input_file:
        with open(args.input_file) as f:
            requests += [json.loads(line) for line in f if line.strip()]
    if not requests:
        raise SystemExit("parashift generate: give prompts or --input-file")
    return requests


def _to_prompt(engine, request: dict, chat_template: bool):
    if "messages" in request:
        return engine.apply_chat_template(request["messages"])
    prompt = request["prompt"]
    has_template = engine.tokenizer is not None and getattr(engine.tokenizer, "chat_template", None)
    if isinstance(prompt, str) and chat_template and has_template:
        return engine.apply_chat_template([{"role": "user", "content": prompt}])
    return prompt


def run_generate(args) -> None:
    from parashift.entrypoints.llm import LLM
    requests = _load_requests(args)
    config = _with_cpu_dtype(engine_config_from_args(args))
    llm = LLM(**config.as_options())
    params = sampling_params_from_args(args, llm.llm_engine.default_sampling)
    prompts = [_to_prompt(llm.llm_engine, r, args.use_chat_template) for r in requests]
    outputs = llm.generate(prompts, params, use_tqdm=len(prompts) > 1)
    out = open(args.output_file, "w") if args.output_file else None
    for request, result in zip(requests, outputs):
        completion = result.outputs[0]
        if out:
            out.write(json.dumps({**request, "text": completion.text,
                                  "token_ids": completion.token_ids,
                                  "finish_reason": completion.finish_reason}) + "\n")
        else:
            print(completion.text)
    if out:
        out.close()


def _with_cpu_dtype(config):
    """`--dtype auto` on a CPU: the faster of bf16 and fp32 on this CPU, said on stderr."""
    from parashift.engine.cpu_dtype import cpu_dtype_choice
    from parashift.engine.startup import resolve_device
    if config.dtype != "auto" or resolve_device(config.device).type != "cpu":
        return config
    dtype, why = cpu_dtype_choice()
    logger.info("dtype %s (%s; --dtype float32 or bfloat16 to choose)", dtype, why)
    return dataclasses.replace(config, dtype=dtype)


def add_plan_args(subparsers) -> None:
    p = subparsers.add_parser("plan", help="print a parallel plan's or a node layout's ranks "
                                           "and groups", formatter_class=DefaultsOnceFormatter,
                              description="Print which coordinates, layers and heads each rank "
                                          "holds under a plan (or under each group's plan of a "
                                          "layout), and its process groups.")
    p.add_argument("--world", type=int, default=None,
                   help="number of ranks (default: the product of the degrees given)")
    p.add_argument("--layout", default=None, help="a node layout instead of degrees: groups in "
                                                  "rank order, e.g. tp2,single,single")
    for dest, long_name in (("tp", "tensor"), ("sp", "sequence"), ("dp", "data"),
                            ("pp", "pipeline")):
        p.add_argument(f"--{dest}", f"-{dest}", f"--{long_name}-parallel-size", dest=dest,
                       type=int, default=None,
                       help=f"{dest} degree (default: fills the world when it is the only one left)")
    p.add_argument("--model", default=None, help="a model or config json to show layers and heads")
    p.add_argument("--nnodes", type=int, default=1, help="hosts: print where each group runs")
    p.add_argument("--gpus-per-node", type=int, default=None,
                   help="ranks per host (default: world / nnodes)")
    p.add_argument("--parallel-policy", default="static",
                   help="place every plan this policy may choose too (static | shift | flying)")
    p.add_argument("--allow-cross-host-tp", action="store_true",
                   help="accept TP or SP groups across hosts")
    p.set_defaults(func=run_plan)


def run_plan(args) -> None:
    from parashift.parallel.layout import Layout, describe_layout
    from parashift.parallel.plan import describe
    layout = Layout.parse(args.layout) if args.layout else Layout.of(_plan_from_degrees(args))
    shape = _model_shape(args.model, layout) if args.model else {}
    if args.layout:
        print(describe_layout(layout, **shape))
    else:
        print(describe(_plan_from_degrees(args), **shape))
    if args.nnodes > 1 or args.gpus_per_node is not None or args.parallel_policy != "static":
        _print_placement(args, layout)


def _print_placement(args, layout) -> None:
    """Where each plan the layout and its policy may run places its groups; an error
    (after the placement) for a TP or SP group across hosts."""
    from dataclasses import replace

    from parashift.config import EngineConfig
    from parashift.engine.policy import make_policy
    from parashift.loader.source import load_hf_config, resolve_model
    from parashift.parallel.topology import describe_placement
    spec = ",".join(replace(plan, rank_set=None).name() for plan in layout.plans)
    config = EngineConfig(model=args.model, layout=spec, nnodes=args.nnodes,
                          gpus_per_node=args.gpus_per_node, parallel_policy=args.parallel_policy,
                          allow_cross_host_tp=True)
    hf_config = load_hf_config(resolve_model(args.model))
    plans = make_policy(config, layout, hf_config).plans
    print(f"\n{len(plans)} plan(s) under the {args.parallel_policy} policy:")
    for plan in plans:
        print(describe_placement(plan, config.topology))
    config.topology.check_plans(plans, args.allow_cross_host_tp)


def _model_shape(model: str, layout) -> dict:
    from parashift.loader.source import load_hf_config, resolve_model
    from parashift.models.moe import check_plan
    cfg = load_hf_config(resolve_model(model))
    for plan in layout.plans:
        check_plan(plan, cfg)
    return dict(num_layers=cfg.num_hidden_layers, num_heads=cfg.num_attention_heads,
                num_kv_heads=cfg.num_key_value_heads)


def _plan_from_degrees(args):
    from parashift.parallel.plan import Plan
    degrees = {k: getattr(args, k) for k in ("dp", "pp", "sp", "tp")}
    given = 1
    for value in degrees.values():
        given *= value or 1
    if args.world is None:
        if all(v is None for v in degrees.values()):
            raise ValueError("give the degrees (e.g. -tp 2), --world, or --layout")
        args.world = given
    missing = [k for k, v in degrees.items() if v is None]
    if args.world % given:
        raise ValueError(f"degrees multiply to {given}, which does not divide world {args.world}")
    degrees = {k: v or 1 for k, v in degrees.items()}
    if args.world != given:
        if not missing:
            raise ValueError(f"dp*pp*sp*tp = {given} but world is {args.world}")
        degrees["dp" if "dp" in missing else missing[0]] = args.world // given
    return Plan(**degrees)
