"""Options of the HTTP server (the engine's options live in EngineConfig)."""
from dataclasses import dataclass, field

from parashift.entrypoints.openai.tool_parsers import TOOL_PARSERS

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
SCHEDULING_POLICIES = ("priority", "fcfs")


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None  # None: no authentication
    served_model_names: list[str] = field(default_factory=list)  # empty: the engine's name
    max_request_bytes: int = 4 * 1024 * 1024
    max_num_queued_requests: int | None = None  # None: no limit
    shutdown_timeout: float = 30.0  # seconds SIGTERM waits for in-flight requests
    drain_delay: float = 0.0  # seconds from SIGTERM (/ready 503, serving on) to the shutdown
    log_level: str = "info"
    access_log: bool = False
    enable_auto_tool_choice: bool = False  # tool_choice "auto": the parser finds the calls
    tool_call_parser: str | None = None  # a name in TOOL_PARSERS
    # vLLM's server options (its flags' names)
    uvicorn_log_level: str | None = None  # None: log_level
    enable_log_requests: bool = False     # one log line per request taken
    max_log_len: int | None = None        # prompt token ids a logged request shows
    disable_fastapi_docs: bool = False    # no /docs, /redoc nor /openapi.json
    allowed_origins: list[str] | None = None  # CORS (None: no CORS headers)
    allowed_methods: list[str] = field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = field(default_factory=lambda: ["*"])
    allow_credentials: bool = False
    root_path: str = ""                   # behind a proxy that serves the app under a path
    uds: str | None = None                # a Unix socket instead of host and port
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    ssl_ca_certs: str | None = None
    ssl_cert_reqs: int = 0                # ssl.CERT_NONE; 2: clients must show a certificate
    ssl_ciphers: str | None = None        # OpenSSL's cipher list (None: uvicorn's)
    log_config_file: str | None = None    # logging configuration (JSON or YAML) for uvicorn
    response_role: str = "assistant"      # the role of chat replies
    # priority: a request's `priority` orders the queue (lower first); fcfs: arrival order,
    # a request with a priority other than 0 is refused (as vLLM's default)
    scheduling_policy: str = "priority"

    def __post_init__(self):
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be >= 1, got {self.max_request_bytes}")
        if self.max_num_queued_requests is not None and self.max_num_queued_requests < 1:
            raise ValueError("max_num_queued_requests must be >= 1, got "
                             f"{self.max_num_queued_requests}")
        if self.shutdown_timeout < 0:
            raise ValueError(f"shutdown_timeout must be >= 0, got {self.shutdown_timeout}")
        if not self.drain_delay >= 0:
            raise ValueError(f"drain_delay must be >= 0, got {self.drain_delay}")
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {LOG_LEVELS}, got {self.log_level!r}")
        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_PARSERS:
            raise ValueError(f"tool_call_parser must be one of {sorted(TOOL_PARSERS)}, got "
                             f"{self.tool_call_parser!r}")
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("enable_auto_tool_choice needs a tool_call_parser")
        self._check_vllm_options()
        if self.api_key == "":
            raise ValueError("api_key must not be empty")
        if any(not name for name in self.served_model_names):
            raise ValueError("served model names must be non-empty")

    def _check_vllm_options(self) -> None:
        if self.uvicorn_log_level is not None and self.uvicorn_log_level not in LOG_LEVELS:
            raise ValueError(f"uvicorn_log_level must be one of {LOG_LEVELS}, got "
                             f"{self.uvicorn_log_level!r}")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {SCHEDULING_POLICIES}, got "
                             f"{self.scheduling_policy!r}")
        if self.max_log_len is not None and self.max_log_len < 0:
            raise ValueError(f"max_log_len must be >= 0, got {self.max_log_len}")
        if self.ssl_cert_reqs not in (0, 1, 2):
            raise ValueError("ssl_cert_reqs must be 0 (none), 1 (optional) or 2 (required), "
                             f"got {self.ssl_cert_reqs}")
        if (self.ssl_keyfile is None) != (self.ssl_certfile is None):
            raise ValueError("HTTPS needs both ssl_keyfile and ssl_certfile")
        if not self.response_role:
            raise ValueError("response_role must not be empty")
        if self.root_path and not self.root_path.startswith("/"):
            raise ValueError(f"root_path must start with '/', got {self.root_path!r}")
