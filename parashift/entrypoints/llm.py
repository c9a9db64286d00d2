"""Offline API in the shape of vLLM's `LLM`.

`llm.shutdown()`, leaving `with LLM(...) as llm:`, or dropping the last reference
(`del llm`) stops the worker processes and releases the model and its KV cache
(GPU memory included), so another `LLM` can start in the same process."""
import gc
import itertools
import os

from tqdm import tqdm

from parashift.config import EngineConfig
from parashift.engine.core_client import make_engine
from parashift.engine.llm_engine import LLMEngine
from parashift.outputs import RequestOutput
from parashift.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    def __init__(self, model: str | None = None, **engine_options):
        self.llm_engine: LLMEngine | None = None  # set first: __del__ runs if the engine fails
        self.llm_engine = make_engine(EngineConfig.from_kwargs(model=model, **engine_options),
                                      offline=True)
        self._request_counter = itertools.count()
        self._profiling = False

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def __del__(self):
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001 - at interpreter exit the modules may be gone
            pass

    @property
    def is_shut_down(self) -> bool:
        return self.llm_engine is None

    def shutdown(self) -> None:
        """Stops the workers and frees the model and KV cache; idempotent. The LLM
        cannot generate afterwards."""
        engine, self.llm_engine = self.llm_engine, None
        if engine is None:
            return
        engine.shutdown()
        del engine
        gc.collect()  # the engine's own reference cycles hold the model's tensors
        _release_device_memory()

    def _engine(self) -> LLMEngine:
        if self.llm_engine is None:
            raise RuntimeError("this LLM has been shut down; create a new one")
        return self.llm_engine

    def get_tokenizer(self):
        return self._engine().tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """What `generate` and `chat` use when given none: SamplingParams' defaults, with
        the model's generation config over them (unless generation_config="vllm")."""
        return SamplingParams(**self._engine().default_sampling)

    def set_layout(self, width: int | None) -> None:
        """Forces every aligned group of `width` replicas to merge (`None`: the parallel
        policy decides again); see `LLMEngine.set_layout`."""
        self._engine().set_layout(width)

    def start_profile(self, trace_dir: str | None = None) -> None:
        """Starts torch.profiler on every rank (vLLM's call). The traces go to `trace_dir`,
        or to $PARASHIFT_TORCH_PROFILER_DIR where it is set, one per rank; with neither,
        `stop_profile` only answers the time per operation."""
        if self._profiling:
            raise RuntimeError("a profile is already running: stop_profile first")
        trace_dir = trace_dir or os.environ.get("PARASHIFT_TORCH_PROFILER_DIR")
        self._engine().executor.collective_rpc("start_profile", trace_dir)
        self._profiling = True

    def stop_profile(self) -> list[dict]:
        """Stops the profiler on every rank; per rank, its trace's path and its operations'
        own time by name, most first (worker/profiler.py)."""
        if not self._profiling:
            raise RuntimeError("no profile is running: start_profile first")
        summaries = self._engine().executor.collective_rpc("stop_profile")
        self._profiling = False
        return summaries

    def generate(self, prompts: Prompt | list[Prompt],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False, priority: list[int] | None = None) -> list[RequestOutput]:
        prompts = _as_prompt_list(prompts)
        params = _per_prompt(sampling_params or self.get_default_sampling_params(), len(prompts))
        priority = priority or [0] * len(prompts)
        if len(priority) != len(prompts):
            raise ValueError(f"{len(priority)} priorities for {len(prompts)} prompts")
        request_ids = self._add_all(prompts, params, priority)
        return self._run(request_ids, use_tqdm)

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | list[SamplingParams] | None = None,
             use_tqdm: bool = False) -> list[RequestOutput]:
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self._engine().apply_chat_template(c) for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm)

    def _add_all(self, prompts, params, priority) -> list[str]:
        engine = self._engine()
        requests = [(str(next(self._request_counter)), prompt, p.final_only(), prio)
                    for prompt, p, prio in zip(prompts, params, priority)]
        # validated before anything runs: a bad prompt leaves no stray requests
        errors = engine.add_requests(requests, atomic=True)
        if errors and errors[-1] is not None:
            raise errors[-1]
        return [request_id for request_id, *_ in requests]

    def _run(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        pending = set(request_ids)
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(request_ids), desc="generating", disable=not use_tqdm)
        while pending:
            for out in self.llm_engine.step():
                if out.finished and out.request_id in pending:
                    pending.discard(out.request_id)
                    finished[out.request_id] = out
                    bar.update(1)
        bar.close()
        return [finished[r] for r in request_ids]


def _release_device_memory() -> None:
    """Returns the cached blocks of a CUDA device this process used to the driver."""
    import torch
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _as_prompt_list(prompts) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(t, int) for t in prompts):
        return [prompts]  # one token-id prompt
    return prompts


def _per_prompt(sampling_params, n: int) -> list[SamplingParams]:
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * n
    if len(sampling_params) != n:
        raise ValueError(f"{len(sampling_params)} sampling params for {n} prompts")
    return list(sampling_params)

