"""Host work per decode step, by part, at fixed batch sizes: what the engine's Python
costs per sequence, apart from the device.

Usage: python3 benchmarks/host_overhead.py --batch-sizes 64 256 512 [--model SHAPE]
[--tokenizer DIR] [--output-processor thread|inline|process|core] [--output-kind final_only]
[--frontend here|process] [--warmup N]
(with a tokenizer the outputs are detokenized; `outputs_made` is the output processor's
work, on its own thread unless inline, and not timed in process mode, where it runs in the
child; `hand_off` and `take_outputs` what the engine loop spends to give it tokens and take
outputs; in process mode `take_outputs` holds `answers_received` (reading and unpickling
the child's answers) and `outputs_built` (the RequestOutputs assembled on the loop); in core
mode the loop is the engine core's (`engine_core_process`): `hand_off` is its forwarding,
`core_state` and `core_send` the state and pickling of each step's message, and `frontend`
the outputs made from it, left out of the host work (they are the caller's process's))
On the CPU (the default tiny shape) the parts are exact but the forward is CPU compute;
`gc` is the garbage collector's time (it runs inside whichever part allocates);
on a GPU the parts are host time only (kernels run asynchronously), and `device_wait`
is the time the host blocks on results. `host_us_per_seq_median` is the median step's host
time per sequence (a noisy host's slow steps move the mean, not it). Each part's milliseconds per step are the sum
over its calls; parts nest (`launch` holds `step_inputs`, `sample_rows` and the rest).
`model_forward` and `model_logits` are the model's calls (the forward's kernels launched on a
GPU, its compute on the CPU): `host_us_per_seq_outside_model` leaves them out, which on the CPU
is the engine's own host work per sequence. One rank only: the parts of worker processes
(plans of several ranks) are not timed."""
import argparse
import collections
import contextlib
import gc
import importlib
import json
import multiprocessing
import pickle
import random
import statistics
import time

import torch

from parashift import LLM, SamplingParams
from parashift.engine import llm_engine, replica, scheduler
from parashift.models.llama import LlamaForCausalLM
from parashift.worker import cuda_graphs, model_runner


def _module_if_any(name: str):
    """A module of this tree, or None in an earlier tree (before/after runs) that lacks it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


output_processor = _module_if_any("parashift.engine.output_processor")
output_process = _module_if_any("parashift.engine.output_process")
request_outputs = _module_if_any("parashift.engine.request_outputs")
core_process = _module_if_any("parashift.engine.core_process")
# the rank's request tables (worker/step_batch.py in a tree before issue 58)
step_chunks = (_module_if_any("parashift.worker.step_chunks")
               or _module_if_any("parashift.worker.step_batch"))

PARTS = [  # (owner, attribute, label)
    (scheduler.Scheduler, "schedule", "schedule"),
    (replica.Replica, "step_batch", "step_message"),
    (step_chunks.RequestTables, "apply", "apply_message"),
    (model_runner.ModelRunner, "launch", "launch"),
    (model_runner, "build_step_inputs", "step_inputs"),
    (cuda_graphs, "build_step_inputs", "step_inputs"),
    (getattr(cuda_graphs, "StepGraphs", None) or getattr(cuda_graphs, "DecodeGraphs", None),
     "_fill", "graph_fill"),
    (torch.cuda.CUDAGraph, "replay", "graph_replay"),
    (model_runner.ModelRunner, "_run_micro_batch", "micro_batch"),
    (getattr(model_runner, "GroupSampling", None), "remember", "remember_samples"),
    (model_runner.ModelRunner, "_fill_placeholders", "fill_placeholders"),
    (model_runner.ModelRunner, "_sample_rows", "sample_rows"),
    (model_runner.PendingStep, "result", "device_wait"),
    (LlamaForCausalLM, "forward", "model_forward"),
    (LlamaForCausalLM, "compute_logits", "model_logits"),
    (scheduler.Scheduler, "update", "scheduler_update"),
    (llm_engine.LLMEngine, "_apply", "step_results"),  # holds scheduler_update and hand_off
    (llm_engine.LLMEngine, "_submit_round", "submit_round"),  # holds schedule, launch
    (llm_engine.LLMEngine, "_detokenize", "detokenize"),  # before the output processor
    (llm_engine.LLMEngine, "_output", "request_outputs"),  # before the output processor
    (getattr(output_processor, "OutputProcessor", None), "submit", "hand_off"),
    (getattr(output_process, "OutputProcess", None), "submit", "hand_off"),
    (getattr(core_process, "OutputForwarder", None), "submit", "hand_off"),
    (getattr(core_process, "EngineCore", None), "_state", "core_state"),
    (llm_engine.LLMEngine, "_collect", "take_outputs"),
    (getattr(output_process, "OutputProcess", None), "_receive", "answers_received"),
    (getattr(output_process, "OutputProcess", None), "_processed", "outputs_built"),
    (getattr(request_outputs, "RequestOutputs", None), "_take_step", "outputs_made"),
]


@contextlib.contextmanager
def timed_parts():
    """Yields a Counter of seconds per label while every part in PARTS is timed, and the
    garbage collector's passes ("gc": inside whichever part they interrupt)."""
    seconds, originals = collections.Counter(), []
    started = []

    def gc_timer(phase, info):
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            spent = time.perf_counter() - started.pop()
            seconds["gc"] += spent
            seconds[f"gc{info['generation']}"] += spent
    gc.callbacks.append(gc_timer)
    for owner, name, label in PARTS:
        original = getattr(owner, name, None)
        if original is None:  # an earlier tree (before/after runs) lacks this part
            continue
        originals.append((owner, name, original))

        def timed(*args, _original=original, _label=label, **kwargs):
            start = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                seconds[_label] += time.perf_counter() - start
        setattr(owner, name, timed)
    try:
        yield seconds
    finally:
        gc.callbacks.remove(gc_timer)
        for owner, name, original in originals:
            setattr(owner, name, original)


def top_functions(profiler, count: int) -> list:
    """The `count` functions with the most own time over the timed steps: (file:line name,
    calls, own ms, ms including callees)."""
    import pstats
    stats = pstats.Stats(profiler).stats
    rows = sorted(stats.items(), key=lambda item: -item[1][2])[:count]
    return [(f"{path.rsplit('/', 2)[-1] if '/' in path else path}:{line} {name}", calls,
             round(own * 1e3, 2), round(cumulative * 1e3, 2))
            for (path, line, name), (_, calls, own, cumulative, _) in rows]


class CoreInThisProcess:
    """The engine core's loop (core_process.EngineCore) run here on the engine: its output
    processor forwards, and each step's messages and state are pickled as the core sends
    them. The caller's share, the outputs made from them (core_client.CoreOutputs), is
    left out of the host work: with `engine_core_process` it runs in another process.
    `frontend="here"` makes them on this thread between steps, timed apart as `frontend`;
    `frontend="process"` sends the messages, as the core does (core_process.Sender), to a
    child process that makes them, so that the core's steps follow one another here as in
    `engine_core_process`."""

    def __init__(self, engine, frontend: str = "here"):
        from parashift.engine.core_client import CoreOutputs
        from parashift.engine.core_process import EngineCore, OutputForwarder, Sender
        engine.output_processor.close()
        engine.output_processor = forwarder = OutputForwarder()
        self.engine, self._sent, self._child = engine, None, None
        self.frontend_s = self.send_s = 0.0
        self._core = EngineCore(engine, forwarder, inbox=None, outbox=self)
        if frontend == "process":
            context = multiprocessing.get_context("spawn")
            self._pipe, there = context.Pipe()
            self._child = context.Process(target=make_outputs_apart,
                                          args=(there, engine.tokenizer), daemon=True)
            self._child.start()
            self._sender = Sender(self._pipe)
        else:
            self._outputs = CoreOutputs(engine.tokenizer, lambda command: None)

    def send(self, message) -> None:  # the core's outbox
        start = time.perf_counter()
        if self._child is not None:
            self._sender.send(message)
        else:
            self._sent = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self.send_s += time.perf_counter() - start

    def step(self) -> list:
        self._core.step()
        if self._child is not None:
            return []  # made in the child: `outputs_made_apart` counts them
        start = time.perf_counter()
        outputs = self._outputs.make(pickle.loads(self._sent)[1])
        self.frontend_s += time.perf_counter() - start
        return outputs

    def outputs_made_apart(self) -> int:
        """The outputs the child made since the last call, once it has caught up."""
        self._sender.send(("count",))
        return self._pipe.recv()

    def add_request(self, request_id, prompt, params) -> None:
        self.engine.add_request(request_id, prompt, params)
        self._tell_frontend("added", request_id, params, 0)

    def abort_request(self, request_id) -> None:
        self._tell_frontend("forget", request_id)
        self.engine.abort_request(request_id)

    def _tell_frontend(self, command: str, *args) -> None:
        if self._child is not None:
            self._sender.send((command, *args))
        else:
            getattr(self._outputs, command)(*args)

    def close(self) -> None:
        if self._child is not None:
            self._sender.send(("stop",))
            self._sender.close()
            self._child.join(30)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def make_outputs_apart(pipe, tokenizer) -> None:
    """The child of `CoreInThisProcess(frontend="process")`: the caller's share of the
    core's messages (its step messages made into outputs, its requests added and
    forgotten), in order; answers "count" with the outputs made since the last."""
    from parashift.engine.core_client import CoreOutputs
    outputs, made = CoreOutputs(tokenizer, lambda command: None), 0
    while True:
        message = pickle.loads(pipe.recv_bytes())
        if message[0] == "step":
            made += len(outputs.make(message[1]))
        elif message[0] == "count":
            pipe.send(made)
            made = 0
        elif message[0] == "stop":
            return
        else:
            getattr(outputs, message[0])(*message[1:])


def measure(engine, batch: int, context: int, steps: int, cprofile: int = 0,
            output_kind: str = "cumulative") -> dict:
    rng = random.Random(batch)
    pool = engine.scheduler.block_manager
    needed = batch * pool.num_blocks_for(engine.max_model_len)
    if needed > pool.num_blocks:  # preemptions would leave fewer running than the batch
        raise RuntimeError(f"batch {batch} needs up to {needed} KV blocks of "
                           f"{pool.block_size} tokens, the pool has {pool.num_blocks}")
    params = SamplingParams(temperature=0, max_tokens=engine.max_model_len - context,
                            ignore_eos=True, output_kind=output_kind)
    ids = [f"b{batch}-{i}" for i in range(batch)]
    for rid in ids:
        engine.add_request(rid, [rng.randrange(engine.vocab_size) for _ in range(context)], params)
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running) \
            or engine.scheduler.num_waiting:
        engine.step()
    for _ in range(3):
        engine.step()
    engine._collect(wait=True)  # an output process still starting does not lag into the timing
    if getattr(engine, "_child", None) is not None:
        engine.outputs_made_apart()  # (the child has caught up; its count starts here)
    profiler = None
    if cprofile:
        import cProfile
        profiler = cProfile.Profile()
    num_outputs = 0
    frontend_before, send_before = (getattr(engine, name, 0.0) for name in ("frontend_s",
                                                                            "send_s"))
    step_hosts = []  # each step's host seconds: its wall time less its waits and frontend
    with timed_parts() as seconds, (profiler or contextlib.nullcontext()):
        start = time.perf_counter()
        for _ in range(steps):
            step_start = time.perf_counter()
            outside = seconds["device_wait"] + getattr(engine, "frontend_s", 0.0)
            num_outputs += len(engine.step())
            step_hosts.append(time.perf_counter() - step_start - seconds["device_wait"]
                              - getattr(engine, "frontend_s", 0.0) + outside)
        wall = time.perf_counter() - start
    if getattr(engine, "_child", None) is not None:
        num_outputs += engine.outputs_made_apart()
    seconds["frontend"] = getattr(engine, "frontend_s", 0.0) - frontend_before
    seconds["core_send"] = getattr(engine, "send_s", 0.0) - send_before
    # a processor that falls behind leaves messages unanswered (its outputs come later)
    pending = getattr(engine.output_processor, "_num_pending", 0)
    if len(engine.scheduler.running) != batch:
        raise RuntimeError(f"{len(engine.scheduler.running)} of {batch} sequences ran to the end")
    for rid in ids:
        engine.abort_request(rid)
    parts = {label: round(s / steps * 1e3, 3) for label, s in seconds.most_common()}
    host = wall - seconds["device_wait"] - seconds["frontend"]
    outside_model = host - seconds["model_forward"] - seconds["model_logits"]
    return dict(batch=batch, step_ms=round(wall / steps * 1e3, 3),
                host_ms=round(host / steps * 1e3, 3),
                host_us_per_seq=round(host / steps / batch * 1e6, 2),
                # the middle step's: robust to a few slow steps (a noisy host, a collector pass)
                host_us_per_seq_median=round(statistics.median(step_hosts) / batch * 1e6, 2),
                host_us_per_seq_outside_model=round(outside_model / steps / batch * 1e6, 2),
                outputs_per_step=round(num_outputs / steps, 1), messages_pending=pending,
                parts_ms=parts,
                **({"top_functions": top_functions(profiler, cprofile)} if profiler else {}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="benchmarks/shapes/tiny-llama.json")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256, 512])
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--decode-steps", type=int, default=20)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--output", default=None)
    p.add_argument("--tokenizer", default=None,
                   help="detokenize the outputs with this tokenizer (default: no tokenizer, "
                        "no text); a shape's random weights sample ids of its whole vocabulary")
    p.add_argument("--output-processor", default=None,
                   choices=["thread", "inline", "process", "core"],
                   help="where outputs are made (default: the engine's); core: the engine "
                        "core's loop (engine_core_process), the outputs made apart")
    p.add_argument("--frontend", default="here", choices=["here", "process"],
                   help="with --output-processor core: where the outputs are made from the "
                        "core's messages (here: on this thread between steps, timed apart; "
                        "process: in a child process, as with engine_core_process)")
    p.add_argument("--output-kind", default="cumulative",
                   choices=["cumulative", "delta", "final_only"],
                   help="the requests' outputs: every step (streaming: all so far, or what is "
                        "new), or the last only")
    p.add_argument("--gc-threshold", type=int, nargs="+", default=None,
                   help="gc.set_threshold(...) after start-up (default: the engine's)")
    p.add_argument("--warmup", type=int, default=1, metavar="N",
                   help="untimed rounds over the batch sizes first (default 1: on GPU "
                        "hosts a fresh process's first batch ran slower in every part)")
    p.add_argument("--cprofile", type=int, default=0, metavar="N",
                   help="profile the timed steps with cProfile (slower: its figures are "
                        "shares, not times) and report the N functions of most own time")
    args = p.parse_args()
    if args.frontend != "here" and args.output_processor != "core":
        p.error("--frontend places the outputs of --output-processor core only")
    options = {} if args.output_processor in (None, "core") else {
        "output_processor": args.output_processor}
    llm = LLM(model=args.model, device=args.device, dtype=args.dtype, **options,
              tokenizer=args.tokenizer, skip_tokenizer_init=args.tokenizer is None,
              max_model_len=args.context + args.decode_steps + 64,
              max_num_seqs=max(args.batch_sizes), enable_prefix_caching=False,
              max_num_batched_tokens=max(8192, args.context * max(args.batch_sizes) // 4))
    if args.gc_threshold:
        gc.set_threshold(*args.gc_threshold)
    engine = llm.llm_engine
    if args.output_processor == "core":
        engine = CoreInThisProcess(engine, args.frontend)
    for _ in range(args.warmup):
        for batch in args.batch_sizes:
            measure(engine, batch, args.context, min(args.decode_steps, 8), 0, args.output_kind)
    rows = []
    for batch in args.batch_sizes:
        rows.append(measure(engine, batch, args.context, args.decode_steps, args.cprofile,
                            args.output_kind))
        print(json.dumps(rows[-1]), flush=True)
    if args.output_processor == "core":
        engine.close()
    llm.llm_engine.shutdown()
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
