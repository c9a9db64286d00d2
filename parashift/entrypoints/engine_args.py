"""Engine flags shared by every CLI command, named as in vLLM."""
import argparse

from parashift.config import SEESAW_WEIGHT_SOURCES, EngineConfig, option_defaults
from parashift.entrypoints.arg_types import human_int, model_len, vllm_dtype
from parashift.entrypoints.launch_env import launch_values

# flag -> (EngineConfig field, type, help); defaults come from EngineConfig
ENGINE_FLAGS = {
    "--tokenizer": ("tokenizer", str, "tokenizer directory (default: the model's)"),
    "--device": ("device", str, "auto | cpu | cuda"),
    "--dtype": ("dtype", vllm_dtype, "auto | float32 (float) | bfloat16 | float16 (half)"),
    "--max-model-len": ("max_model_len", model_len, "context window, e.g. 4096 or 32k "
                                                    "(default or auto: the model's)"),
    "--max-logprobs": ("max_logprobs", int, "most logprobs a request may ask for per token "
                                            "(-1: no cap)"),
    "--max-num-seqs": ("max_num_seqs", int, "most sequences in one step"),
    "--max-num-batched-tokens": ("max_num_batched_tokens", human_int, "token budget of one step "
                                 "(default: 8192 on GPUs, 16384 for the offline "
                                 "LLM on GPUs of >= 70 GiB but the A100, 512 on the CPU)"),
    "--pp-micro-batch-tokens": ("pp_micro_batch_tokens", int, "least tokens of one micro-batch "
                                "of a pipelined step (a step of fewer runs whole: a stage "
                                "reads its weights once per micro-batch)"),
    "--long-prefill-token-threshold": ("long_prefill_token_threshold", int,
                                       "cap on one request's prefill chunk (0: none; "
                                       "default: half the step budget)"),
    "--seed": ("seed", int, "seed of the engine's sampler and random weights"),
    "--block-size": ("block_size", int, "tokens per KV block"),
    "--num-blocks": ("num_blocks", int, "KV pool size in blocks (default: sized from "
                                        "--kv-cache-memory or the free memory)"),
    "--kv-cache-memory": ("kv_cache_memory", int, "KV pool size in bytes (default: 1 GiB on "
                                                  "the CPU; from --gpu-memory-utilization "
                                                  "on GPUs)"),
    "--gpu-memory-utilization": ("gpu_memory_utilization", float,
                                 "fraction of GPU memory the engine may use"),
    "--attention-backend": ("attention_backend", str, "auto | torch | torch-ref | triton | cudnn"),
    "--output-processor": ("output_processor", str, "auto (process on a GPU host with a "
                                                    "tokenizer, else inline; the default) | "
                                                    "inline (detokenization, stop strings and "
                                                    "outputs on the engine loop) | "
                                                    "thread (beside it, a step later) | "
                                                    "process (in a process of its own)"),
    "--load-format": ("load_format", str, "auto | dummy (random weights)"),
    "--parallel-policy": ("parallel_policy", str, "static | shift (SP base plan, TP for small "
                                                  "steps) | flying (DP replicas merge into one "
                                                  "TP group under light load) | seesaw (PP "
                                                  "prefill, TP decode, KV through a CPU tier) "
                                                  "| sidp (DP replicas share FFN weights)"),
    "--cost-profile": ("cost_profile", str, "the cost model's profiles the policies decide "
                                            "from: auto (the committed ones of this GPU "
                                            "kind) or a compute profile's JSON "
                                            "(`parashift profile --output`); default: none, "
                                            "the policies' fixed thresholds"),
    "--prefill-plan": ("prefill_plan", str, "seesaw policy: each group's prefill plan, e.g. "
                                            "pp2 or pp2xtp2 (-dp gives the groups); auto "
                                            "(every GPU) or auto:<ranks per group>: the pair, "
                                            "or a static plan where no pair pays, from a "
                                            "roofline cost model over probed rates"),
    "--decode-plan": ("decode_plan", str, "seesaw policy: each group's decode plan over the "
                                          "same ranks, e.g. tp2 (omit or auto with "
                                          "--prefill-plan auto)"),
    "--seesaw-mean-prompt-tokens": ("seesaw_mean_prompt_tokens", int,
                                    "--prefill-plan auto: the workload's mean prompt length "
                                    "(default: 1024)"),
    "--seesaw-mean-output-tokens": ("seesaw_mean_output_tokens", int,
                                    "--prefill-plan auto: the workload's mean output length "
                                    "(default: 128)"),
    "--seesaw-num-requests": ("seesaw_num_requests", int,
                              "--prefill-plan auto: requests held at once (an offline batch, or "
                              "the concurrency when serving), which bounds the decode batch "
                              "(default: every replica at --max-num-seqs)"),
    "--seesaw-request-rate": ("seesaw_request_rate", float,
                              "--prefill-plan auto with --cost-profile: the online arrival "
                              "rate (requests/s); plans are then ranked by a request's "
                              "latency (default: offline, by throughput)"),
    "--seesaw-workload-file": ("seesaw_workload_file", str,
                               "--prefill-plan auto with --cost-profile: the requests' "
                               "lengths, a JSON list of [prompt_tokens, output_tokens] pairs "
                               "(instead of the means and count), or of [prompt_tokens, "
                               "output_tokens, arrival_s] triples (an online trace)"),
    "--cpu-kv-tokens": ("cpu_kv_tokens", int, "seesaw policy: tokens of the CPU KV tier (per "
                                              "group); a prefill phase ends when it is full"),
    "--cpu-kv-gib": ("cpu_kv_gib", float, "seesaw policy: the CPU KV tier in GiB (per group) "
                                          "instead of --cpu-kv-tokens"),
    "--seesaw-max-prefill-ms": ("seesaw_max_prefill_ms", float,
                                "seesaw policy: a prefill phase ends after this long when "
                                "there is something to decode (0: unbounded)"),
    "--preemption-mode": ("preemption_mode", str, "a request preempted when the KV pool runs "
                                                  "out: recompute (computed again when "
                                                  "resumed) | swap (its KV kept in a CPU tier "
                                                  "of --swap-space GiB and copied back; "
                                                  "recompute when the tier is full)"),
    "--swap-space": ("swap_space", float, "--preemption-mode swap: GiB of CPU memory per group "
                                          "for swapped KV"),
    "--sidp-mode": ("sidp_mode", str, "shared FFN weights under the static policy: cas "
                                      "(tokens go to the owners' slices) | was (slices "
                                      "fetched into slots)"),
    "--sidp-slots": ("sidp_slots", int, "shared FFN weights: FFN layers a replica holds at "
                                        "once in Weight-as-a-Service (fetched ahead)"),
    "--sidp-batch-threshold": ("sidp_batch_threshold", int,
                               "sidp policy: Weight-as-a-Service above this many tokens per "
                               "busy replica's step, Compute-as-a-Service below (hysteresis "
                               "20%%)"),
    "--sidp-probe-file": ("sidp_probe_file", str,
                          "sidp policy: take B_th for this model, -dp and -tp from "
                          "benchmarks/sidp_probe.py's JSON (e.g. benchmarks/results/"
                          "sidp_probe_h200.json) instead of --sidp-batch-threshold"),
    "--sidp-min-dwell-steps": ("sidp_min_dwell_steps", int,
                               "sidp policy: least steps between two switches"),
    "--sidp-mean-prompt-tokens": ("sidp_mean_prompt_tokens", int,
                                  "sidp policy with --cost-profile: the workload's mean prompt "
                                  "length; told (this or the three below), the start-up runs "
                                  "the best static plan instead where the cost model predicts "
                                  "it beats SiDP (default: 1024)"),
    "--sidp-mean-output-tokens": ("sidp_mean_output_tokens", int,
                                  "sidp policy with --cost-profile: the workload's mean output "
                                  "length (default: 128)"),
    "--sidp-num-requests": ("sidp_num_requests", int,
                            "sidp policy with --cost-profile: an offline batch's requests"),
    "--sidp-request-rate": ("sidp_request_rate", float,
                            "sidp policy with --cost-profile: the online arrival rate "
                            "(requests/s; plans then ranked by a request's latency)"),
    "--sidp-workload-file": ("sidp_workload_file", str,
                             "sidp policy with --cost-profile: the requests' lengths, a JSON "
                             "list of [prompt_tokens, output_tokens] pairs (instead of the "
                             "means and count), or of [prompt_tokens, output_tokens, "
                             "arrival_s] triples (an online trace: its bursts, not only its "
                             "mean rate)"),
    "--flying-mean-prompt-tokens": ("flying_mean_prompt_tokens", int,
                                    "flying policy with --cost-profile: the workload's mean "
                                    "prompt length; told (this or the four below), the policy "
                                    "merges no wider than the width whose layout the cost "
                                    "model predicts serves it best"),
    "--flying-mean-output-tokens": ("flying_mean_output_tokens", int,
                                    "flying policy with --cost-profile: the mean output length"),
    "--flying-num-requests": ("flying_num_requests", int,
                              "flying policy with --cost-profile: an offline batch's requests"),
    "--flying-request-rate": ("flying_request_rate", float,
                              "flying policy with --cost-profile: the online arrival rate "
                              "(requests/s)"),
    "--flying-workload-file": ("flying_workload_file", str,
                               "flying policy with --cost-profile: the requests' lengths, a "
                               "JSON list of [prompt_tokens, output_tokens] pairs, or of "
                               "[prompt_tokens, output_tokens, arrival_s] triples"),
    "--flying-merge-running": ("flying_merge_running", int, "flying policy: merge the replicas "
                                                            "at or below this many running "
                                                            "requests and none waiting"),
    "--flying-dwell-s": ("flying_dwell_s", float, "flying policy: least seconds from a "
                                                  "transition to a merge (a queue splits at "
                                                  "once)"),
    "--flying-preemption": ("flying_preemption", str, "running requests of a merge or split: "
                                                      "auto (the policy's choice per transition: "
                                                      "flying recomputes them in a merge for load, "
                                                      "pauses them in a merge for a priority "
                                                      "request, keeps them in a split unless "
                                                      "computing them again costs less) | "
                                                      "soft (finish where their KV was written, "
                                                      "interleaved with the new groups' steps) | "
                                                      "hard (paused while the new groups have "
                                                      "more urgent requests) | recompute "
                                                      "(moved, computed again)"),
    "--shift-threshold": ("shift_threshold", int, "shift policy: steps of at most this many "
                                                 "tokens run under full TP"),
    "--shift-weights": ("shift_weights", str, "shift policy: reorder (default: base rows "
                                              "permuted so each shift shard is one view) | "
                                              "slice (views of the base shard) | separate "
                                              "(contiguous copy)"),
    "--shift-mean-prompt-tokens": ("shift_mean_prompt_tokens", int,
                                   "shift policy with --cost-profile: the workload's mean prompt "
                                   "length; told (this or the four below), the start-up runs the "
                                   "best static plan instead where the cost model predicts it "
                                   "beats Shift (as --sidp-mean-prompt-tokens)"),
    "--shift-mean-output-tokens": ("shift_mean_output_tokens", int,
                                   "shift policy with --cost-profile: the mean output length"),
    "--shift-num-requests": ("shift_num_requests", int,
                             "shift policy with --cost-profile: an offline batch's requests"),
    "--shift-request-rate": ("shift_request_rate", float,
                             "shift policy with --cost-profile: the online arrival rate "
                             "(requests/s)"),
    "--shift-workload-file": ("shift_workload_file", str,
                              "shift policy with --cost-profile: the requests' lengths, a JSON "
                              "list of [prompt_tokens, output_tokens] pairs, or of "
                              "[prompt_tokens, output_tokens, arrival_s] triples"),
    "--merge-weights": ("merge_weights", str, "merged plans (Flying Serving): reorder (default: "
                                              "rows permuted once at load so each width's shard "
                                              "is one view) | view (slices of the replica) | "
                                              "materialize (contiguous copy)"),
    "--moe-parallel": ("moe_parallel", str, "mixture-of-experts models: tp (default: every rank "
                                            "holds 1/tp of each expert) | ep (whole experts "
                                            "split over the SP x TP ranks)"),
    "--quantization": ("quantization", str, "fp8: linear weights in FP8 E4M3, quantized at "
                                            "load (default: the checkpoint's own scheme; FP8 "
                                            "checkpoints load as they are)"),
    "--kv-cache-dtype": ("kv_cache_dtype", str, "auto (the model's dtype) | fp8 | fp8_e4m3: "
                                                "KV pages in E4M3, twice the tokens"),
    "--layout": ("layout", str, "the node's groups in rank order instead of the parallel sizes, "
                                "e.g. tp2,single,single (ranks 0-1 as TP=2, ranks 2 and 3 alone)"),
    "--timeline-file": ("timeline_file", str, "write one JSON line per step (plan, tokens, time)"),
    "--worker-timeout-s": ("worker_timeout_s", float, "fail the engine when a worker's start "
                                                     "or a layout transition takes longer"),
    "--worker-step-timeout-s": ("worker_step_timeout_s", float,
                                "a step that takes longer loses its ranks (they hang): their "
                                "group leaves the layout, its requests go to the others"),
    "--worker-heartbeat-timeout-s": ("worker_heartbeat_timeout_s", float,
                                     "a running worker whose heartbeat is this old is dead "
                                     "(a stopped one after 1 s): its group leaves the "
                                     "layout; with none left the engine fails (a server "
                                     "exits non-zero)"),
    "--max-worker-restarts": ("max_worker_restarts", int,
                              "replacements of a lost group's workers per hour; past them "
                              "its ranks stay out, named in /health (0: none, a loss is "
                              "for good)"),
    "--chat-template": ("chat_template", str, "a Jinja chat template: a file, or the template "
                                              "itself (default: the tokenizer's)"),
    "--speculative-config": ("speculative_config", str,
                             "speculative decoding as vLLM's JSON, e.g. '{\"method\": "
                             "\"ngram\", \"num_speculative_tokens\": 4}'; methods: ngram "
                             "(prompt_lookup_min/max), suffix (suffix_decoding_*), "
                             "draft_model (model); see docs/speculative_decoding.md"),
    "--generation-config": ("generation_config", str,
                            "request defaults (temperature, top_p, top_k, min_p, "
                            "repetition_penalty, max_tokens): auto = the model's "
                            "generation_config.json, vllm = none, or a folder holding one"),
}


# Launch across hosts (torchrun's and SGLang's names): default None, then the launcher's
# variables (launch_env.py), then EngineConfig's defaults.
LAUNCH_FLAGS = {
    "--nnodes": ("nnodes", int, "hosts; each runs `parashift serve` with the same flags "
                                "(default: $WORLD_SIZE / $LOCAL_WORLD_SIZE, else 1)"),
    "--node-rank": ("node_rank", int, "this host: 0 runs the engine and the HTTP server, the "
                                      "others only their ranks (default: $NODE_RANK, else 0)"),
    "--master-addr": ("master_addr", str, "node 0's address (default: $MASTER_ADDR, else "
                                          "127.0.0.1)"),
    "--master-port": ("master_port", int, "node 0's rendezvous port; its control channel "
                                          "listens on the next one (default: $MASTER_PORT, "
                                          "else 29500)"),
}

PARALLEL_FLAGS = [
    ("--tensor-parallel-size", "-tp", "tensor_parallel_size"),
    ("--sequence-parallel-size", "-sp", "sequence_parallel_size"),
    ("--data-parallel-size", "-dp", "data_parallel_size"),
    ("--pipeline-parallel-size", "-pp", "pipeline_parallel_size"),
]


def add_engine_args(parser: argparse.ArgumentParser, model_flag: bool = True) -> None:
    defaults = option_defaults()
    group = parser.add_argument_group("engine")
    if model_flag:
        group.add_argument("--model", default=None,
                           help="HF directory, .gguf file or config .json for random weights "
                                "(default: embedded SmolLM2-135M-Instruct)")
    for flag, (name, type_, help_) in ENGINE_FLAGS.items():
        group.add_argument(flag, dest=name, type=type_, default=defaults[name], help=help_)
    for flag, (name, type_, help_) in LAUNCH_FLAGS.items():
        group.add_argument(flag, dest=name, type=type_, default=None, help=help_)
    group.add_argument("--gpus-per-node", type=int, default=None,
                       help="ranks per host (default: world size / nnodes)")
    group.add_argument("--distributed-executor-backend", default="mp",
                       help="mp (worker processes; TCP to other hosts) | ray (Ray actors on "
                            "a running Ray cluster)")
    group.add_argument("--allow-cross-host-tp", action="store_true",
                       help="let a TP or SP group span hosts (slow: every layer all-reduces)")
    for flag, short, name in PARALLEL_FLAGS:
        group.add_argument(flag, short, dest=name, type=int, default=defaults[name],
                           help=name.replace('_', ' '))
    group.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                       default=defaults["enable_prefix_caching"],
                       help="reuse the KV of a prompt's cached prefix blocks")
    group.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction,
                       default=defaults["enable_chunked_prefill"],
                       help="cut a long prompt's prefill over several steps (off: each "
                            "prompt prefills whole in one step; the step budget holds "
                            "--max-model-len tokens)")
    group.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                       help="run decode steps, and steps that prefill up to 2,048 tokens, as "
                            "CUDA graphs (default: on where possible: "
                            "CUDA, triton attention, the plans able to replay them: all "
                            "but a Seesaw prefill plan's and SiDP's WaS plans', whose "
                            "steps run eagerly)")
    group.add_argument("--enforce-eager", dest="cuda_graphs", action="store_const", const=False,
                       help="no CUDA graphs (as vLLM's flag; same as --no-cuda-graphs)")
    group.add_argument("--no-mixed-step-graphs", dest="mixed_step_graphs", action="store_false",
                       help="steps that prefill run eagerly (by default, with CUDA graphs, those "
                            "of up to 2,048 tokens and 64 sequences replay graphs too)")
    group.add_argument("--disable-fast-all-reduce", dest="fast_all_reduce", action="store_false",
                       help="all-reduce through NCCL only (no symmetric-memory one-shot path)")
    group.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                       help="schedule the next step while one runs (default: on for one rank; "
                            "off with --speculative-config unless asked for)")
    group.add_argument("--check-step-state", action="store_true",
                       help="debug: check every step's inputs, built from the ranks' persistent "
                            "state, against a rebuild from scratch (slow)")
    group.add_argument("--share-ffn", action="store_true",
                       help="SiDP: the data-parallel replicas share their FFN weights, each "
                            "rank holding 1/dp of every FFN layer (more KV memory)")
    group.add_argument("--enable-expert-parallel", dest="moe_parallel", action="store_const",
                       const="ep", help="as vLLM's flag: --moe-parallel ep")
    group.add_argument("--deterministic", action="store_true",
                       help="batch- and plan-invariant kernels: a request's tokens and logprobs "
                            "do not depend on its batch, the parallel plan or a switch (slower)")
    group.add_argument("--seesaw-resident-weights", action="store_true",
                       help="seesaw policy: keep both plans' weight shards on the device (no "
                            "weight copies at a transition; less KV memory)")
    group.add_argument("--seesaw-weight-source", choices=SEESAW_WEIGHT_SOURCES, default="auto",
                       help="seesaw policy: a transition's missing weight shards from the pinned "
                            "host copies, or from the group's ranks that hold them (NCCL "
                            "point-to-point; host copies for the rest); auto (default): peers "
                            "where the group's GPUs reach each other directly")
    group.add_argument("--engine-core-process", action=argparse.BooleanOptionalAction,
                       default=None,
                       help="the engine core (scheduler, executor) in a process of its own; "
                            "this process makes the outputs, as vLLM v1 (default: on for "
                            "serve on a GPU host of 4+ cores, off otherwise)")
    group.add_argument("--skip-tokenizer-init", action="store_true",
                       help="no tokenizer: prompts are token ids, outputs have no text")
    group.add_argument("--trust-remote-code", action="store_true",
                       help="let transformers run the code a model directory ships for its "
                            "config and tokenizer")


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    names = [name for name, _, _ in ENGINE_FLAGS.values()]
    names += ["model", "enable_prefix_caching", "enable_chunked_prefill", "skip_tokenizer_init", "trust_remote_code",
              "cuda_graphs", "mixed_step_graphs",
              "fast_all_reduce", "async_scheduling", "check_step_state", "deterministic", "share_ffn",
              "seesaw_resident_weights", "engine_core_process"]
    names += [name for _, _, name in PARALLEL_FLAGS]
    names += ["gpus_per_node", "distributed_executor_backend", "allow_cross_host_tp"]
    return EngineConfig(**{n: getattr(args, n) for n in names if hasattr(args, n)},
                        **launch_values(args))
