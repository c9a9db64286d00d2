"""vLLM's `serve` flags that mean nothing here, or that ask for what parashift cannot do.

A vLLM command line runs unchanged: a flag that `parashift serve` implements is one of its
own (cli_args.py, engine_args.py); one in `NO_EFFECT` is accepted and says in one line why
it changes nothing; one in `REFUSED` stops start-up with what to use instead, unless it is
given at its neutral value (e.g. `--cpu-offload-gb 0`). `--quantization`,
`--kv-cache-dtype` and `--speculative-config` are parashift's own flags."""
import argparse
import json
from dataclasses import dataclass

from parashift.entrypoints.arg_types import human_int


@dataclass(frozen=True)
class VllmFlag:
    why: str                   # the notice, or (refused) what to use instead
    takes_value: bool = True   # False: a switch (--x, and --no-x as vLLM's booleans)
    neutral: tuple = ()        # values that ask for nothing (accepted without a word)
    nargs: str | None = None   # "+": a list of values


NO_EFFECT = {
    "--max-parallel-loading-workers": VllmFlag("every rank loads its own shard at once"),
    "--max-seq-len-to-capture": VllmFlag("CUDA graphs cover decode steps of any length "
                                         "(--cuda-graphs / --enforce-eager)"),
    "--cuda-graph-sizes": VllmFlag("the CUDA graph sizes are parashift's own", nargs="+"),
    "--compilation-config": VllmFlag("no torch.compile here; CUDA graphs are "
                                     "--cuda-graphs / --enforce-eager"),
    "-O": VllmFlag("no torch.compile here; CUDA graphs are --cuda-graphs / --enforce-eager"),
    "--disable-log-stats": VllmFlag("no periodic stats log here (the statistics are on "
                                    "/metrics)", takes_value=False),
    "--limit-mm-per-prompt": VllmFlag("text-only models here: no multimodal inputs"),
    "--mm-processor-kwargs": VllmFlag("text-only models here: no multimodal inputs"),
    "--guided-decoding-backend": VllmFlag("structured outputs use parashift's own grammar "
                                          "engine"),
    "--structured-outputs-config": VllmFlag("structured outputs use parashift's own grammar "
                                            "engine"),
    "--reasoning-parser": VllmFlag("no reasoning parsers here: a model's reasoning stays "
                                   "in the reply's content"),
    "--revision": VllmFlag("models load from a local path (no hub download)"),
    "--code-revision": VllmFlag("models load from a local path (no hub download)"),
    "--tokenizer-revision": VllmFlag("models load from a local path (no hub download)"),
    "--download-dir": VllmFlag("models load from a local path (no hub download)"),
    "--hf-token": VllmFlag("models load from a local path (no hub download)"),
    "--disable-sliding-window": VllmFlag("attention here is over the whole context",
                                         takes_value=False),
    "--disable-cascade-attn": VllmFlag("no cascade attention here", takes_value=False),
    "--num-scheduler-steps": VllmFlag("one step per schedule (vLLM v1 dropped it too)"),
    "--enable-eplb": VllmFlag("experts are placed statically (--moe-parallel)",
                              takes_value=False),
    "--disable-frontend-multiprocessing": VllmFlag(
        "the engine core's process is --engine-core-process", takes_value=False),
    "--otlp-traces-endpoint": VllmFlag("no OpenTelemetry traces here (/metrics has the "
                                       "request timings)"),
    "--enable-prompt-tokens-details": VllmFlag("usage has no prompt token details here",
                                               takes_value=False),
    "--enable-server-load-tracking": VllmFlag("the load is always on /health, /ready and "
                                              "/metrics", takes_value=False),
    "--enable-force-include-usage": VllmFlag("usage comes with every non-streamed reply and "
                                             "streams that ask for it", takes_value=False),
    "--enable-request-id-headers": VllmFlag("request ids are in the response bodies",
                                            takes_value=False),
    "--return-tokens-as-token-ids": VllmFlag("logprobs name tokens by their text",
                                             takes_value=False),
    "--enable-log-outputs": VllmFlag("--enable-log-requests logs the requests, not their "
                                     "outputs", takes_value=False),
    "--data-parallel-backend": VllmFlag("data-parallel replicas run as the executor's "
                                        "ranks (--distributed-executor-backend)"),
    "--chat-template-content-format": VllmFlag("message content is rendered as a string",
                                               neutral=("auto", "string")),
    "--logprobs-mode": VllmFlag("logprobs are of the processed distribution",
                                neutral=("processed_logprobs",)),
    "--tokenizer-mode": VllmFlag("the tokenizer is the model's fast one",
                                 neutral=("auto", "hf")),
    "--enable-sleep-mode": VllmFlag("no sleep mode here (the weights stay on the device)",
                                    takes_value=False),
    "--prefix-caching-hash-algo": VllmFlag("prefix blocks are matched by their tokens"),
    "--max-num-partial-prefills": VllmFlag("the step budget decides how many prompts "
                                           "prefill together"),
    "--max-long-partial-prefills": VllmFlag("the step budget decides how many prompts "
                                            "prefill together"),
    "--ignore-patterns": VllmFlag("models load from a local path (no hub download)"),
    "--use-tqdm-on-load": VllmFlag("loading logs what it loads and how long it took",
                                   takes_value=False),
    "--model-loader-extra-config": VllmFlag("the loader reads the model's files as they are"),
    "--pt-load-map-location": VllmFlag("weights load onto each rank's device"),
    "--config-format": VllmFlag("the model's config.json (or GGUF metadata) is read",
                                neutral=("auto", "hf")),
    "--model-impl": VllmFlag("the models are parashift's own", neutral=("auto", "vllm")),
    "--disable-async-output-proc": VllmFlag("outputs are made as --output-processor says",
                                            takes_value=False),
    "--num-lookahead-slots": VllmFlag("no lookahead slots here"),
    "--scheduler-delay-factor": VllmFlag("the scheduler admits requests at once"),
    "--disable-hybrid-kv-cache-manager": VllmFlag("one KV cache manager here",
                                                  takes_value=False),
    "--api-server-count": VllmFlag("one API server process here", neutral=("1",)),
    "--exclude-tools-when-tool-choice-none": VllmFlag(
        "tools are shown to the template with tool_choice none, as vLLM's default",
        takes_value=False),
    "--trust-request-chat-template": VllmFlag("requests cannot bring a chat template here",
                                              takes_value=False),
    "--enable-tokenizer-info-endpoint": VllmFlag("no /tokenizer_info endpoint here",
                                                 takes_value=False),
    "--h11-max-incomplete-event-size": VllmFlag("uvicorn's limits apply; bodies are capped "
                                                "by --max-request-bytes"),
    "--h11-max-header-count": VllmFlag("uvicorn's limits apply"),
    "--log-error-stack": VllmFlag("unexpected errors are logged with their stack; clients "
                                  "never see one", takes_value=False),
    "--enable-ssl-refresh": VllmFlag("restart the server to take new certificates",
                                     takes_value=False),
    "--disable-access-log-for-endpoints": VllmFlag("the access log is off unless "
                                                   "--access-log"),
    "--kv-events-config": VllmFlag("no KV cache events are published here"),
    "--show-hidden-metrics-for-version": VllmFlag("/metrics has parashift's own metrics"),
    "--collect-detailed-traces": VllmFlag("no OpenTelemetry traces here"),
    "--enable-reasoning": VllmFlag("no reasoning parsers here: a model's reasoning stays "
                                   "in the reply's content", takes_value=False),
    "--disable-chunked-mm-input": VllmFlag("text-only models here: no multimodal inputs",
                                           takes_value=False),
    "--mm-processor-cache-gb": VllmFlag("text-only models here: no multimodal inputs"),
    "--allowed-local-media-path": VllmFlag("text-only models here: no multimodal inputs"),
    "--media-io-kwargs": VllmFlag("text-only models here: no multimodal inputs"),
    "--override-pooler-config": VllmFlag("parashift serves text generation only (no pooling)"),
    "--ray-workers-use-nsight": VllmFlag("profile with llm.start_profile() instead",
                                         takes_value=False),
    "--multi-step-stream-outputs": VllmFlag("one step per schedule (vLLM v1 dropped it too)",
                                            takes_value=False),
    "--use-v2-block-manager": VllmFlag("the block manager is parashift's own",
                                       takes_value=False),
}

REFUSED = {
    "--enable-lora": VllmFlag("LoRA adapters are not supported: merge the adapter into the "
                              "weights and serve the merged model", takes_value=False),
    "--lora-modules": VllmFlag("LoRA adapters are not supported: merge the adapter into the "
                               "weights and serve the merged model"),
    "--max-loras": VllmFlag("LoRA adapters are not supported"),
    "--max-lora-rank": VllmFlag("LoRA adapters are not supported"),
    "--cpu-offload-gb": VllmFlag("weights are not offloaded to the CPU: use more GPUs "
                                 "(-tp, -pp) or a smaller --dtype", neutral=("0", "0.0")),
    "--task": VllmFlag("parashift serves text generation only", neutral=("auto", "generate")),
    "--runner": VllmFlag("parashift serves text generation only",
                         neutral=("auto", "generate")),
    "--convert": VllmFlag("parashift serves text generation only", neutral=("auto", "none")),
    "--data-parallel-size-local": VllmFlag("give --data-parallel-size, and --nnodes / "
                                           "--node-rank to span hosts"),
    "--data-parallel-address": VllmFlag("hosts meet at --master-addr / --master-port"),
    "--data-parallel-rpc-port": VllmFlag("hosts meet at --master-addr / --master-port"),
    "--data-parallel-start-rank": VllmFlag("give --node-rank (ranks are numbered host by "
                                           "host)"),
    "--headless": VllmFlag("a host of --node-rank above 0 serves only its ranks",
                           takes_value=False),
    "--worker-cls": VllmFlag("the worker is parashift's own", neutral=("auto",)),
    "--worker-extension-cls": VllmFlag("the worker is parashift's own", neutral=("",)),
    "--middleware": VllmFlag("no ASGI middleware can be added: put a proxy in front"),
    "--tool-parser-plugin": VllmFlag("tool call parsers are built in: --tool-call-parser",
                                     neutral=("",)),
    "--hf-overrides": VllmFlag("edit the model directory's config.json instead"),
    "--override-generation-config": VllmFlag("give --generation-config a folder holding the "
                                             "generation_config.json you want"),
    "--enable-prompt-embeds": VllmFlag("prompts are text or token ids", takes_value=False),
    "--rope-scaling": VllmFlag("edit the model directory's config.json instead"),
    "--rope-theta": VllmFlag("edit the model directory's config.json instead"),
    "--hf-config-path": VllmFlag("the config.json in the model directory is read"),
    "--default-chat-template-kwargs": VllmFlag("the template is rendered with messages, tools "
                                               "and add_generation_prompt only: edit it and "
                                               "give it with --chat-template"),
    "--tool-server": VllmFlag("built-in tools are not supported: give tools as functions in "
                              "/v1/chat/completions"),
    "--tokens-only": VllmFlag("every endpoint is served", takes_value=False),
    "--kv-transfer-config": VllmFlag("no KV transfer between instances here (disaggregated "
                                     "prefill): Seesaw moves KV between plans on one node "
                                     "(--parallel-policy seesaw)"),
    "--enable-lora-bias": VllmFlag("LoRA adapters are not supported", takes_value=False),
    "--fully-sharded-loras": VllmFlag("LoRA adapters are not supported", takes_value=False),
    "--max-cpu-loras": VllmFlag("LoRA adapters are not supported"),
    "--lora-dtype": VllmFlag("LoRA adapters are not supported", neutral=("auto",)),
    "--data-parallel-hybrid-lb": VllmFlag("one server balances its replicas itself; to span "
                                          "hosts give --nnodes / --node-rank",
                                          takes_value=False),
    "--data-parallel-external-lb": VllmFlag("one server balances its replicas itself; to "
                                            "span hosts give --nnodes / --node-rank",
                                            takes_value=False),
    "--config": VllmFlag("no YAML config file here: give the flags on the command line"),
}

# vLLM's names of parashift's own flags: flag -> (destination, type)
ALIASES = {"--kv-cache-memory-bytes": ("kv_cache_memory", human_int),
           "--num-gpu-blocks-override": ("num_blocks", int)}

# vLLM's switches that set one of parashift's options: flag -> (destination, value, notice)
TAKEN_AS = {"--disable-custom-all-reduce": ("fast_all_reduce", False, "taken as "
                                            "--disable-fast-all-reduce (all-reduces through "
                                            "NCCL only)")}

# vLLM's names for values parashift spells otherwise: (flag, destination) -> {vLLM: ours}
VALUE_NAMES = {
    ("--distributed-executor-backend", "distributed_executor_backend"): {"uni": "mp"},
    ("--load-format", "load_format"): {"safetensors": "auto", "pt": "auto", "gguf": "auto"},
}


def add_vllm_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "vLLM's flags", "vLLM's names of parashift's options, and vLLM's flags that change "
        "nothing here (accepted with a one-line notice) or that it cannot honour (refused, "
        "naming what to use instead)")
    for flag, spec in NO_EFFECT.items():
        _add_vllm_flag(group, flag, spec, f"no effect here: {spec.why}")
    for flag, spec in REFUSED.items():
        _add_vllm_flag(group, flag, spec, f"refused: {spec.why}")
    for flag, (dest, type_) in ALIASES.items():
        group.add_argument(flag, dest=dest, type=type_, default=argparse.SUPPRESS,
                           help=f"vLLM's name of --{dest.replace('_', '-')}")
    for flag, (dest, _, notice) in TAKEN_AS.items():
        group.add_argument(flag, dest=_dest(flag), action="store_true", help=notice)


def _add_vllm_flag(group, flag: str, spec: VllmFlag, help_: str) -> None:
    if spec.takes_value:
        group.add_argument(flag, dest=_dest(flag), default=None, metavar="VALUE",
                           nargs=spec.nargs, help=help_)
    else:
        group.add_argument(flag, dest=_dest(flag), default=None,
                           action=argparse.BooleanOptionalAction, help=help_)


def apply_vllm_flags(args: argparse.Namespace) -> list[str]:
    """The notices of the vLLM flags given that change nothing; ValueError naming the first
    refused one. Values spelt as vLLM spells them become parashift's."""
    for flag, spec in REFUSED.items():
        if _given(getattr(args, _dest(flag)), spec):
            raise ValueError(f"{flag} is not supported here: {spec.why}")
    notices = [f"{flag}: accepted with no effect: {spec.why}"
               for flag, spec in NO_EFFECT.items() if _given(getattr(args, _dest(flag)), spec)]
    for flag, (dest, value, notice) in TAKEN_AS.items():
        if getattr(args, _dest(flag)):
            setattr(args, dest, value)
            notices.append(f"{flag}: {notice}")
    if getattr(args, "swap_space", None) is not None and args.preemption_mode != "swap":
        notices.append("--swap-space: accepted with no effect: it sizes the CPU tier of "
                       "--preemption-mode swap; preemption recomputes, as in vLLM v1")
        args.swap_space = None
    for (flag, dest), names in VALUE_NAMES.items():
        value = getattr(args, dest, None)
        if value in names:
            notices.append(f"{flag} {value}: taken as {names[value]}")
            setattr(args, dest, names[value])
    _check_json(args, "--compilation-config", "--structured-outputs-config",
                "--limit-mm-per-prompt")
    return notices


def _given(value, spec: VllmFlag) -> bool:
    if value is None or value is False:
        return False
    return not (spec.takes_value and str(value) in spec.neutral)


def _check_json(args: argparse.Namespace, *flags: str) -> None:
    """vLLM takes these as JSON (or `-O`'s level); a malformed one is an error there too."""
    for flag in flags:
        value = getattr(args, _dest(flag))
        if value is None or value.strip().lstrip("-").isdigit():
            continue
        try:
            json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{flag} takes JSON: {exc}") from None


def _dest(flag: str) -> str:
    return "vllm_" + flag.lstrip("-").replace("-", "_")
