"""What a soak runs: its length, its traffic, the server's plan and the kills."""
from dataclasses import asdict, dataclass, field


@dataclass
class SoakConfig:
    duration_s: float = 1800.0       # of traffic after the warm-up
    warmup_s: float = 120.0          # of the same traffic, before the baseline is taken
    concurrency: int = 6             # requests in flight, one per client lane
    data_parallel: int = 2
    tensor_parallel: int = 1
    kill_every_s: float = 180.0      # a worker SIGKILLed this often; 0: never
    max_kills: int | None = None     # at most this many kills (None: as many as fit)
    model: str | None = None         # None: the embedded SmolLM2-135M-Instruct
    # a small KV pool, every block of it written during the warm-up: the CPU pool's pages
    # are faulted in on first use (kv/cache.py), which a larger pool shows as slow growth
    num_blocks: int | None = 128
    max_model_len: int | None = 1024
    serve_args: list[str] = field(default_factory=list)
    request_timeout_s: float = 300.0  # a request without an answer by then has hung
    sample_every_s: float = 15.0     # process tree sampling
    rss_tolerance: float = 0.10
    recover_timeout_s: float = 120.0
    start_timeout_s: float = 600.0
    seed: int = 0
    out_dir: str = "soak-out"

    def __post_init__(self):
        for name in ("duration_s", "warmup_s", "request_timeout_s", "sample_every_s",
                     "recover_timeout_s", "start_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        for name in ("concurrency", "data_parallel", "tensor_parallel"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise ValueError(f"{name} must be an integer of at least 1, got "
                                 f"{getattr(self, name)!r}")
        if self.kill_every_s < 0:
            raise ValueError(f"kill_every_s must be 0 (never) or positive, got "
                             f"{self.kill_every_s!r}")
        if self.max_kills is not None and self.max_kills < 0:
            raise ValueError(f"max_kills must be at least 0, got {self.max_kills!r}")
        if not 0 < self.rss_tolerance < 1:
            raise ValueError(f"rss_tolerance must be in (0, 1), got {self.rss_tolerance!r}")

    @property
    def planned_kills(self) -> int:
        if not self.kill_every_s:
            return 0
        fit = int(self.duration_s // self.kill_every_s)
        return fit if self.max_kills is None else min(fit, self.max_kills)

    def serve_flags(self, heal: bool) -> list[str]:
        flags = ["-dp", str(self.data_parallel), "-tp", str(self.tensor_parallel)]
        if self.model:
            flags += ["--model", self.model]
        if self.num_blocks:
            flags += ["--num-blocks", str(self.num_blocks)]
        if self.max_model_len:
            flags += ["--max-model-len", str(self.max_model_len)]
        if heal and self.planned_kills:  # room for every kill of the soak
            flags += ["--max-worker-restarts", str(self.planned_kills + 2)]
        return flags + list(self.serve_args)

    def as_dict(self) -> dict:
        return asdict(self)
