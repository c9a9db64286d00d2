"""Options of the HTTP server (the engine's options live in EngineConfig)."""
from dataclasses import dataclass, field

from parashift.entrypoints.openai.tool_parsers import TOOL_PARSERS

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


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
        if self.api_key == "":
            raise ValueError("api_key must not be empty")
        if any(not name for name in self.served_model_names):
            raise ValueError("served model names must be non-empty")
