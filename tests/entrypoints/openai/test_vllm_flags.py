"""A vLLM `serve` command line runs unchanged: each of vLLM's common flags, with a value as
a vLLM user gives it, sets the option it means here, or is accepted with a one-line notice,
or is refused naming the flag and what to use instead. Parsed only: no server starts."""
import argparse
import shlex

import pytest

from parashift.entrypoints.openai.cli_args import add_serve_args, serve_configs
from parashift.entrypoints.openai.vllm_flags import NO_EFFECT, REFUSED
from parashift.spec_decode.config import SpeculativeConfig

ENGINE, SERVER, NOTICE, ERROR = "engine", "server", "notice", "error"

# (the flags as typed, the outcome, then: the option and its value (engine / server), or
# a piece of the notice / error)
FLAG_WALK = [
    # the engine's options
    ("--enable-prefix-caching", ENGINE, "enable_prefix_caching", True),
    ("--no-enable-prefix-caching", ENGINE, "enable_prefix_caching", False),
    ("--enable-chunked-prefill", ENGINE, "enable_chunked_prefill", True),
    ("--no-enable-chunked-prefill", ENGINE, "enable_chunked_prefill", False),
    ("--max-logprobs 50", ENGINE, "max_logprobs", 50),
    ("--enforce-eager", ENGINE, "cuda_graphs", False),
    ("--max-num-seqs 8", ENGINE, "max_num_seqs", 8),
    ("--max-num-batched-tokens 8k", ENGINE, "max_num_batched_tokens", 8000),
    ("--seed 7", ENGINE, "seed", 7),
    ("--block-size 32", ENGINE, "block_size", 32),
    ("--gpu-memory-utilization 0.8", ENGINE, "gpu_memory_utilization", 0.8),
    ("--trust-remote-code", ENGINE, "trust_remote_code", True),
    ("--tokenizer /models/tok", ENGINE, "tokenizer", "/models/tok"),
    ("--model /models/m", ENGINE, "model", "/models/m"),
    ("--load-format dummy", ENGINE, "load_format", "dummy"),
    ("--load-format safetensors", ENGINE, "load_format", "auto"),
    ("--dtype half", ENGINE, "dtype", "float16"),
    ("--dtype bfloat16", ENGINE, "dtype", "bfloat16"),
    ("--max-model-len 32k", ENGINE, "max_model_len", 32000),
    ("--max-model-len 2K", ENGINE, "max_model_len", 2048),
    ("--max-model-len auto", ENGINE, "max_model_len", None),
    ("--max-model-len -1", ENGINE, "max_model_len", None),
    ("--generation-config vllm", ENGINE, "generation_config", "vllm"),
    ("--chat-template /t.jinja", ENGINE, "chat_template", "/t.jinja"),
    ("--distributed-executor-backend ray", ENGINE, "distributed_executor_backend", "ray"),
    ("--distributed-executor-backend uni", ENGINE, "distributed_executor_backend", "mp"),
    ("--tensor-parallel-size 2", ENGINE, "tensor_parallel_size", 2),
    ("-tp 2", ENGINE, "tensor_parallel_size", 2),
    ("--pipeline-parallel-size 2", ENGINE, "pipeline_parallel_size", 2),
    ("--data-parallel-size 2", ENGINE, "data_parallel_size", 2),
    ("--enable-expert-parallel", ENGINE, "moe_parallel", "ep"),
    ("--swap-space 4", ENGINE, "swap_space", None),
    ("--preemption-mode swap --swap-space 4", ENGINE, "swap_space", 4.0),
    ("--kv-cache-memory-bytes 1G", ENGINE, "kv_cache_memory", 2 ** 30),
    ("--num-gpu-blocks-override 100", ENGINE, "num_blocks", 100),
    ("--disable-custom-all-reduce", ENGINE, "fast_all_reduce", False),
    ("--async-scheduling", ENGINE, "async_scheduling", True),
    ("--long-prefill-token-threshold 64", ENGINE, "long_prefill_token_threshold", 64),
    ("--cpu-offload-gb 0", ENGINE, "model", None),  # its neutral value asks for nothing
    ("--tokenizer-mode auto", ENGINE, "model", None),
    ("--task generate", ENGINE, "model", None),
    ("--quantization fp8", ENGINE, "quantization", "fp8"),
    ("--quantization gptq", ERROR, "gptq"),
    ("--kv-cache-dtype fp8", ENGINE, "kv_cache_dtype", "fp8"),
    ("--kv-cache-dtype fp8_e4m3", ENGINE, "kv_cache_dtype", "fp8_e4m3"),
    ("--kv-cache-dtype int8", ERROR, "int8"),
    ("""--speculative-config '{"method": "ngram", "num_speculative_tokens": 3}'""", ENGINE,
     "speculative_config", SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 3})),
    ("""--speculative-config '{"method": "eagle9"}'""", ERROR, "eagle9"),
    # the server's options
    ("--host 0.0.0.0", SERVER, "host", "0.0.0.0"),
    ("--port 9000", SERVER, "port", 9000),
    ("--api-key k", SERVER, "api_key", "k"),
    ("--served-model-name a b", SERVER, "served_model_names", ["a", "b"]),
    ("--uvicorn-log-level debug", SERVER, "uvicorn_log_level", "debug"),
    ("--disable-log-requests", SERVER, "enable_log_requests", False),
    ("--enable-log-requests", SERVER, "enable_log_requests", True),
    ("--enable-log-requests --max-log-len 10", SERVER, "max_log_len", 10),
    ("--disable-fastapi-docs", SERVER, "disable_fastapi_docs", True),
    ("--allowed-origins '[\"https://a.example\"]'", SERVER, "allowed_origins",
     ["https://a.example"]),
    ("--allowed-origins '[\"*\"]' --allowed-methods '[\"GET\", \"POST\"]'", SERVER,
     "allowed_methods", ["GET", "POST"]),
    ("--allowed-origins '[\"*\"]' --allowed-headers '[\"X-A\"]'", SERVER, "allowed_headers",
     ["X-A"]),
    ("--allow-credentials", SERVER, "allow_credentials", True),
    ("--root-path /api", SERVER, "root_path", "/api"),
    ("--uds /tmp/parashift.sock", SERVER, "uds", "/tmp/parashift.sock"),
    ("--ssl-keyfile k.pem --ssl-certfile c.pem", SERVER, "ssl_certfile", "c.pem"),
    ("--ssl-keyfile k.pem --ssl-certfile c.pem --ssl-ca-certs ca.pem", SERVER, "ssl_ca_certs",
     "ca.pem"),
    ("--ssl-keyfile k.pem --ssl-certfile c.pem --ssl-cert-reqs 2", SERVER, "ssl_cert_reqs", 2),
    ("--ssl-keyfile k.pem --ssl-certfile c.pem --ssl-ciphers ECDHE-RSA-AES256-GCM-SHA384",
     SERVER, "ssl_ciphers", "ECDHE-RSA-AES256-GCM-SHA384"),
    ("--response-role bot", SERVER, "response_role", "bot"),
    ("--enable-auto-tool-choice --tool-call-parser hermes", SERVER, "tool_call_parser",
     "hermes"),
    ("--scheduling-policy fcfs", SERVER, "scheduling_policy", "fcfs"),
    ("--scheduling-policy priority", SERVER, "scheduling_policy", "priority"),
    ("--access-log --disable-uvicorn-access-log", SERVER, "access_log", False),
    ("--log-config-file log.json", SERVER, "log_config_file", "log.json"),
    # accepted with a notice
    ("--disable-custom-all-reduce", NOTICE, "--disable-fast-all-reduce"),
    ("--swap-space 4", NOTICE, "--preemption-mode swap"),
    ("--load-format pt", NOTICE, "taken as auto"),
    ("--distributed-executor-backend uni", NOTICE, "taken as mp"),
    ("--max-parallel-loading-workers 2", NOTICE, "no effect"),
    ("--max-seq-len-to-capture 8192", NOTICE, "no effect"),
    ("--cuda-graph-sizes 1 2 4", NOTICE, "no effect"),
    ("--compilation-config '{\"level\": 3}'", NOTICE, "torch.compile"),
    ("-O3", NOTICE, "torch.compile"),
    ("--disable-log-stats", NOTICE, "/metrics"),
    ("--limit-mm-per-prompt '{\"image\": 0}'", NOTICE, "text-only"),
    ("--mm-processor-kwargs '{}'", NOTICE, "text-only"),
    ("--guided-decoding-backend xgrammar", NOTICE, "grammar"),
    ("--structured-outputs-config '{\"backend\": \"xgrammar\"}'", NOTICE, "grammar"),
    ("--reasoning-parser deepseek_r1", NOTICE, "reasoning"),
    ("--revision main", NOTICE, "local path"),
    ("--code-revision main", NOTICE, "local path"),
    ("--tokenizer-revision main", NOTICE, "local path"),
    ("--download-dir /data/hf", NOTICE, "local path"),
    ("--hf-token hf_x", NOTICE, "local path"),
    ("--disable-sliding-window", NOTICE, "no effect"),
    ("--disable-cascade-attn", NOTICE, "no effect"),
    ("--num-scheduler-steps 8", NOTICE, "no effect"),
    ("--enable-eplb", NOTICE, "--moe-parallel"),
    ("--disable-frontend-multiprocessing", NOTICE, "--engine-core-process"),
    ("--otlp-traces-endpoint http://collector:4317", NOTICE, "OpenTelemetry"),
    ("--enable-prompt-tokens-details", NOTICE, "no effect"),
    ("--enable-server-load-tracking", NOTICE, "/health"),
    ("--enable-force-include-usage", NOTICE, "usage"),
    ("--enable-request-id-headers", NOTICE, "no effect"),
    ("--return-tokens-as-token-ids", NOTICE, "no effect"),
    ("--enable-log-outputs", NOTICE, "outputs"),
    ("--data-parallel-backend ray", NOTICE, "no effect"),
    ("--chat-template-content-format openai", NOTICE, "string"),
    ("--logprobs-mode raw_logprobs", NOTICE, "processed"),
    ("--tokenizer-mode slow", NOTICE, "fast"),
    ("--enable-sleep-mode", NOTICE, "sleep"),
    ("--prefix-caching-hash-algo sha256", NOTICE, "no effect"),
    ("--max-num-partial-prefills 2", NOTICE, "step budget"),
    ("--max-long-partial-prefills 1", NOTICE, "step budget"),
    ("--ignore-patterns original/**", NOTICE, "local path"),
    ("--use-tqdm-on-load", NOTICE, "how long"),
    ("--model-loader-extra-config '{}'", NOTICE, "as they are"),
    ("--pt-load-map-location cuda:0", NOTICE, "device"),
    ("--config-format mistral", NOTICE, "config.json"),
    ("--model-impl transformers", NOTICE, "parashift's own"),
    ("--disable-async-output-proc", NOTICE, "--output-processor"),
    ("--num-lookahead-slots 4", NOTICE, "lookahead"),
    ("--scheduler-delay-factor 0.5", NOTICE, "at once"),
    ("--disable-hybrid-kv-cache-manager", NOTICE, "one KV cache manager"),
    ("--api-server-count 4", NOTICE, "one API server"),
    ("--exclude-tools-when-tool-choice-none", NOTICE, "tool_choice none"),
    ("--trust-request-chat-template", NOTICE, "chat template"),
    ("--enable-tokenizer-info-endpoint", NOTICE, "/tokenizer_info"),
    ("--h11-max-incomplete-event-size 1000", NOTICE, "--max-request-bytes"),
    ("--h11-max-header-count 64", NOTICE, "uvicorn"),
    ("--log-error-stack", NOTICE, "stack"),
    ("--enable-ssl-refresh", NOTICE, "restart"),
    ("--disable-access-log-for-endpoints /health", NOTICE, "--access-log"),
    ("--kv-events-config '{}'", NOTICE, "events"),
    ("--show-hidden-metrics-for-version 0.9", NOTICE, "/metrics"),
    ("--collect-detailed-traces all", NOTICE, "traces"),
    ("--enable-reasoning", NOTICE, "reasoning"),
    ("--disable-chunked-mm-input", NOTICE, "text-only"),
    ("--mm-processor-cache-gb 0", NOTICE, "text-only"),
    ("--allowed-local-media-path /data", NOTICE, "text-only"),
    ("--media-io-kwargs '{}'", NOTICE, "text-only"),
    ("--override-pooler-config '{}'", NOTICE, "pooling"),
    ("--ray-workers-use-nsight", NOTICE, "start_profile"),
    ("--multi-step-stream-outputs", NOTICE, "one step"),
    ("--use-v2-block-manager", NOTICE, "block manager"),
    ("--api-server-count 1", ENGINE, "model", None),  # the neutral value: not a word
    # refused, naming the flag and what to use instead
    ("--enable-lora", ERROR, "--enable-lora is not supported here: LoRA"),
    ("--lora-modules sql=/loras/sql", ERROR, "--lora-modules is not supported here: LoRA"),
    ("--max-loras 4", ERROR, "--max-loras"),
    ("--max-lora-rank 64", ERROR, "--max-lora-rank"),
    ("--cpu-offload-gb 4", ERROR, "--cpu-offload-gb is not supported here: weights are not "
                                  "offloaded"),
    ("--task embed", ERROR, "--task is not supported here: parashift serves text generation"),
    ("--runner pooling", ERROR, "--runner"),
    ("--convert embed", ERROR, "--convert"),
    ("--data-parallel-size-local 2", ERROR, "--nnodes"),
    ("--data-parallel-address 10.0.0.1", ERROR, "--master-addr"),
    ("--data-parallel-rpc-port 13345", ERROR, "--master-port"),
    ("--data-parallel-start-rank 2", ERROR, "--node-rank"),
    ("--headless", ERROR, "--node-rank"),
    ("--worker-cls my.Worker", ERROR, "--worker-cls"),
    ("--worker-extension-cls my.Ext", ERROR, "--worker-extension-cls"),
    ("--middleware my.mw", ERROR, "proxy"),
    ("--tool-parser-plugin p.py", ERROR, "--tool-call-parser"),
    ("--hf-overrides '{\"rope_theta\": 1}'", ERROR, "config.json"),
    ("--override-generation-config '{\"temperature\": 0.5}'", ERROR, "--generation-config"),
    ("--enable-prompt-embeds", ERROR, "token ids"),
    ("--rope-scaling '{\"type\": \"yarn\"}'", ERROR, "config.json"),
    ("--rope-theta 1000000", ERROR, "config.json"),
    ("--hf-config-path /cfg", ERROR, "config.json"),
    ("--default-chat-template-kwargs '{\"enable_thinking\": false}'", ERROR,
     "--chat-template"),
    ("--tool-server demo", ERROR, "built-in tools"),
    ("--tokens-only", ERROR, "--tokens-only"),
    ("--kv-transfer-config '{}'", ERROR, "--kv-transfer-config is not supported here"),
    ("--enable-lora-bias", ERROR, "LoRA"),
    ("--fully-sharded-loras", ERROR, "LoRA"),
    ("--max-cpu-loras 2", ERROR, "LoRA"),
    ("--lora-dtype bfloat16", ERROR, "LoRA"),
    ("--data-parallel-hybrid-lb", ERROR, "--nnodes"),
    ("--data-parallel-external-lb", ERROR, "--nnodes"),
    ("--config serve.yaml", ERROR, "command line"),
    ("--compilation-config '{level: 3'", ERROR, "--compilation-config takes JSON"),
    ("--distributed-executor-backend external_launcher", ERROR, "mp or ray"),
    ("--no-enable-chunked-prefill --max-num-batched-tokens 1024 --max-model-len 4096", ERROR,
     "without chunked prefill"),
    ("--no-enable-chunked-prefill --long-prefill-token-threshold 64", ERROR,
     "enable_chunked_prefill"),
    ("--max-logprobs -2", ERROR, "max_logprobs"),
    ("--max-model-len 0", ERROR, "max_model_len"),
    ("--ssl-keyfile k.pem", ERROR, "ssl_certfile"),
    ("--enable-auto-tool-choice", ERROR, "tool_call_parser"),
]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_args(parser.add_subparsers(dest="command"))
    return parser.parse_args(["serve", *argv])


def first_flag(flags: str) -> str:
    """The first flag typed (-O3 is -O with 3)."""
    first = shlex.split(flags)[0]
    return first[:2] if first.startswith("-O") else first


def outcome(flags: str):
    """(server config, engine config, notices) of `parashift serve <flags>`."""
    return serve_configs(parse(shlex.split(flags)))


@pytest.mark.parametrize("row", FLAG_WALK, ids=[row[0] + " -> " + row[1] for row in FLAG_WALK])
def test_vllm_flag(row, monkeypatch):
    flags, kind, *expected = row
    monkeypatch.delenv("PARASHIFT_API_KEY", raising=False)
    if kind == ERROR:
        with pytest.raises(ValueError) as refused:
            outcome(flags)
        assert expected[0] in str(refused.value)
        return
    server, engine, notices = outcome(flags)
    if kind == NOTICE:
        flag = first_flag(flags)
        assert [n for n in notices if n.startswith(flag) and expected[0] in n], notices
        assert len(notices) == 1, notices  # one line, for this flag only
        return
    name, value = expected
    assert getattr(engine if kind == ENGINE else server, name) == value
    if not flags.startswith(("--swap-space", "--disable-custom", "--load-format safe",
                             "--distributed-executor-backend uni")):
        assert notices == []  # a flag that works here says nothing


def test_the_walk_covers_every_flag_accepted_or_refused():
    walked = {first_flag(row[0]) for row in FLAG_WALK}
    assert set(NO_EFFECT) <= walked and set(REFUSED) <= walked


def test_no_flag_gives_no_notice_and_the_defaults():
    server, engine, notices = outcome("")
    assert notices == []
    assert engine.enable_prefix_caching and engine.enable_chunked_prefill
    assert engine.max_logprobs == 20 and engine.fast_all_reduce
    assert server.scheduling_policy == "priority" and not server.enable_log_requests


def test_a_vllm_users_command_line_parses_whole():
    line = ("--host 0.0.0.0 --port 8001 --served-model-name smol --dtype half "
            "--max-model-len 2k --gpu-memory-utilization 0.85 --enable-prefix-caching "
            "--enable-chunked-prefill --max-num-seqs 64 --max-num-batched-tokens 4096 "
            "--disable-log-requests --disable-log-stats --uvicorn-log-level warning "
            "--max-logprobs 30 --swap-space 4 --disable-custom-all-reduce --seed 1 "
            "--trust-remote-code --tensor-parallel-size 1")
    server, engine, notices = outcome(line)
    assert (engine.dtype, engine.max_model_len, engine.max_logprobs) == ("float16", 2000, 30)
    assert (server.port, server.served_model_names) == (8001, ["smol"])
    assert len(notices) == 3 and all(n.startswith("--") for n in notices)


def test_the_cli_prints_a_refusal_and_exits_2(capsys):
    from parashift.cli import main
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--enable-lora", "--lora-modules", "a=/b"])
    assert exited.value.code == 2
    assert "--enable-lora is not supported here" in capsys.readouterr().err
