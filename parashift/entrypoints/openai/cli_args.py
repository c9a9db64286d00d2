"""`parashift serve [MODEL] [engine flags] [server flags]`.

`add_serve_args(subparsers)` adds the `serve` sub-command with the server flags
and the engine flags (from `parashift.entrypoints.engine_args`); adding the
engine flags again is harmless (conflicts resolve to the last definition).
`run_serve(args)` builds the engine and serves until SIGTERM/SIGINT, or until the
engine dies (a worker died or stopped answering): then it exits with code 1. After a
SIGTERM it exits 0 once every request has finished, 1 if --shutdown-timeout ended some."""
import argparse
import json
import logging
import sys

from parashift.entrypoints.help_format import DefaultsOnceFormatter
from parashift.entrypoints.openai.auth import resolve_api_key
from parashift.entrypoints.openai.server_config import (LOG_LEVELS, SCHEDULING_POLICIES,
                                                        ServerConfig)
from parashift.entrypoints.openai.tool_parsers import TOOL_PARSERS
from parashift.entrypoints.openai.vllm_flags import add_vllm_flags, apply_vllm_flags


def add_serve_args(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "serve", help="serve a model over an OpenAI-compatible HTTP API",
        formatter_class=DefaultsOnceFormatter,
        description="Serve MODEL (default: the embedded SmolLM2-135M-Instruct) over an "
                    "OpenAI-compatible HTTP API.", conflict_handler="resolve")
    parser.add_argument("model_path", nargs="?", default=None, metavar="MODEL",
                        help="HF directory, .gguf file or config .json for random weights "
                             "(same as --model; omitted: the embedded model)")
    add_server_flags(parser)
    engine_args = _engine_args_module()
    if engine_args is not None:
        engine_args.add_engine_args(parser)
    add_vllm_flags(parser)
    parser.set_defaults(func=run_serve)
    return parser


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    defaults = ServerConfig()
    group = parser.add_argument_group("server")
    group.add_argument("--host", default=defaults.host,
                       help="address to bind (default %(default)s: this machine only)")
    group.add_argument("--port", type=int, default=defaults.port, help="port to listen on")
    group.add_argument("--api-key", default=None,
                       help="require 'Authorization: Bearer KEY' on /v1 routes "
                            "(default: env PARASHIFT_API_KEY, else no key)")
    group.add_argument("--served-model-name", nargs="+", default=[],
                       help="model name(s) the API accepts (default: the engine's)")
    group.add_argument("--max-request-bytes", type=int, default=defaults.max_request_bytes,
                       help="larger request bodies get 413")
    group.add_argument("--max-num-queued-requests", type=int, default=None,
                       help="with this many requests waiting, new ones get 503")
    group.add_argument("--shutdown-timeout", type=float, default=defaults.shutdown_timeout,
                       help="seconds SIGTERM lets in-flight requests finish")
    group.add_argument("--drain-delay", type=float, default=defaults.drain_delay,
                       help="seconds from SIGTERM to the shutdown, during which /ready "
                            "answers 503 and requests are still served (a balancer or "
                            "Kubernetes stops routing here first)")
    group.add_argument("--log-level", default=defaults.log_level, choices=LOG_LEVELS,
                       help="the server's log level")
    group.add_argument("--access-log", action="store_true", help="log every HTTP request")
    group.add_argument("--enable-auto-tool-choice", action="store_true",
                       help='allow tool_choice "auto": the model\'s calls are parsed from its text '
                            "(needs --tool-call-parser)")
    group.add_argument("--tool-call-parser", default=None, choices=sorted(TOOL_PARSERS),
                       help="the format of the model's tool calls: hermes (Hermes, Qwen2.5) or "
                            "llama3_json (Llama 3.x)")
    add_vllm_server_flags(parser)


def add_vllm_server_flags(parser: argparse.ArgumentParser) -> None:
    """vLLM's server flags (its names) that parashift implements."""
    group = parser.add_argument_group("server (vLLM's flags)")
    group.add_argument("--uvicorn-log-level", default=None, choices=LOG_LEVELS,
                       help="uvicorn's log level (default: --log-level)")
    group.add_argument("--disable-uvicorn-access-log", dest="access_log", action="store_false",
                       default=argparse.SUPPRESS, help="no access log (the default)")
    group.add_argument("--enable-log-requests", action="store_true",
                       help="log one line per request: its id, prompt token ids and sampling options")
    group.add_argument("--disable-log-requests", dest="enable_log_requests",
                       action="store_false", help="no request log (the default)")
    group.add_argument("--max-log-len", type=int, default=None,
                       help="prompt token ids a logged request shows (default: all)")
    group.add_argument("--disable-fastapi-docs", action="store_true",
                       help="serve no /docs, /redoc nor /openapi.json")
    for name in ("origins", "methods", "headers"):
        group.add_argument(f"--allowed-{name}", type=json_list, default=None,
                           help=f"CORS: allowed {name}, a JSON list (default: no CORS headers"
                                + ("" if name == "origins" else "; with origins: all") + ")")
    group.add_argument("--allow-credentials", action="store_true", help="CORS: credentials")
    group.add_argument("--root-path", default="", help="the path a proxy serves the app under")
    group.add_argument("--uds", default=None, help="listen on this Unix socket instead")
    for name in ("keyfile", "certfile", "ca-certs"):
        group.add_argument(f"--ssl-{name}", default=None, help=f"HTTPS: the {name} file")
    group.add_argument("--ssl-cert-reqs", type=int, default=0,
                       help="HTTPS: 0 no client certificate, 1 optional, 2 required")
    group.add_argument("--ssl-ciphers", default=None, help="HTTPS: OpenSSL's cipher list")
    group.add_argument("--log-config-file", default=None,
                       help="uvicorn's logging configuration (JSON or YAML file)")
    group.add_argument("--response-role", default="assistant", help="the role of chat replies")
    group.add_argument("--scheduling-policy", default="priority", choices=SCHEDULING_POLICIES,
                       help="priority: a request's priority orders the queue; fcfs: arrival "
                            "order, a request with a priority other than 0 gets 400")


def json_list(text: str) -> list[str]:
    """A JSON list of strings, as vLLM takes --allowed-origins; a bare word is a list of one."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return [text]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise argparse.ArgumentTypeError(f"expected a JSON list of strings, got {text!r}")
    return value


def server_config_from_args(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        host=args.host, port=args.port, api_key=resolve_api_key(args.api_key),
        served_model_names=list(args.served_model_name),
        max_request_bytes=args.max_request_bytes,
        max_num_queued_requests=args.max_num_queued_requests,
        shutdown_timeout=args.shutdown_timeout, drain_delay=args.drain_delay,
        log_level=args.log_level,
        access_log=args.access_log, enable_auto_tool_choice=args.enable_auto_tool_choice,
        tool_call_parser=args.tool_call_parser,
        allowed_methods=args.allowed_methods or ["*"],
        allowed_headers=args.allowed_headers or ["*"],
        **{name: getattr(args, name) for name in VLLM_SERVER_OPTIONS})


VLLM_SERVER_OPTIONS = ("uvicorn_log_level", "enable_log_requests", "max_log_len",
                       "disable_fastapi_docs", "allowed_origins", "allow_credentials",
                       "root_path", "uds", "ssl_keyfile", "ssl_certfile", "ssl_ca_certs",
                       "ssl_cert_reqs", "ssl_ciphers", "log_config_file", "response_role", "scheduling_policy")


def serve_configs(args: argparse.Namespace, engine_config_from_args=None):
    """(ServerConfig, EngineConfig, notices) of `serve`'s flags: the vLLM flags given that
    change nothing each have a notice; ValueError for a refused or invalid one."""
    notices = apply_vllm_flags(args)
    return server_config_from_args(args), _engine_config(args, engine_config_from_args), notices


def run_serve(args: argparse.Namespace, engine_config_from_args=None) -> None:
    from parashift.engine.core_client import make_engine
    from parashift.entrypoints.openai.api_server import build_app
    from parashift.entrypoints.openai.launcher import run_server

    config, engine_config, notices = serve_configs(args, engine_config_from_args)
    for notice in notices:
        _say(notice)
    if engine_config.node_rank > 0:  # another host: its ranks only, driven by node 0
        from parashift.executor.node_agent import run_node_agent
        _say(f"node {engine_config.node_rank} of {engine_config.nnodes}: serving its ranks "
             f"for {engine_config.master_addr}:{engine_config.master_port}")
        sys.exit(run_node_agent(engine_config.nnodes, engine_config.node_rank,
                                engine_config.master_addr, engine_config.master_port,
                                engine_config.worker_timeout_s))
    engine = make_engine(engine_config)
    app = build_app(engine, config)
    auth = "an API key required" if config.api_key else "no API key"
    where = f"unix:{config.uds}" if config.uds else \
        f"{'https' if config.ssl_certfile else 'http'}://{config.host}:{config.port}"
    _say(f"serving {engine.model_name} on {where} ({auth}; "
         f"max_model_len {engine.max_model_len})")
    run_server(app, config)
    dead = app.state.async_engine.dead_error
    if dead is not None:
        _say(f"exiting: {dead}")
        sys.exit(1)
    if app.state.shutdown_deadline.passed:
        _say(f"exiting: the shutdown timeout ({config.shutdown_timeout:g} s) ended requests "
             "still running")
        sys.exit(1)


def _say(message: str) -> None:
    print(f"parashift serve: {message}", file=sys.stderr, flush=True)


def _engine_config(args, engine_config_from_args):
    positional, flag = args.model_path, getattr(args, "model", None)
    if positional is not None and flag is not None and positional != flag:
        raise ValueError(f"two models given: {positional!r} and --model {flag!r}")
    args.model = positional if positional is not None else flag
    if engine_config_from_args is None:
        module = _engine_args_module()
        if module is None:
            from parashift.config import EngineConfig
            return EngineConfig(model=args.model)
        engine_config_from_args = module.engine_config_from_args
    return engine_config_from_args(args)


def _engine_args_module():
    try:
        from parashift.entrypoints import engine_args
    except ImportError:
        return None
    return engine_args


def main(argv: list[str] | None = None) -> None:
    """`python -m parashift.entrypoints.openai serve ...` without the main CLI."""
    parser = argparse.ArgumentParser(prog="parashift", formatter_class=DefaultsOnceFormatter)
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_serve_args(subparsers)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper() if args.log_level != "trace" else "DEBUG",
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args.func(args)
