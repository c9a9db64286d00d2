"""Where a CPU decode step's time goes, without the profiler's per-op cost: parashift's engine
and transformers' `generate` on the embedded SmolLM2, each module kind timed by forward hooks
(perf_counter before and after, summed over the layers) in decode calls only (one token a
sequence), so the two models' parts sit side by side.

Usage: python3 benchmarks/cpu_step_parts.py [--dtype bfloat16] [--batch 16] [--threads 2]
  [--new-tokens 32] [--prompt-len 64] [--repeats 3] [--engines parashift transformers]
  [--output parts.json]
Per engine: the decode step without the part hooks (`decode_step_ms`: the median time from
one decode forward's start to the next, one hook on the model; the median of --repeats
generates), then, in one generate with the hooks, ms a decode step of each part: `norms`,
`qkv`, `attention` (parashift: rotary, KV writes and attention, and inside it
`attention.rotary`, `attention.write_kv`, `attention.attend`; transformers: its attention
module less its projections), `o_proj`, `gate_up` (transformers: gate and up), `act`,
`down`, `lm_head`, `layers` (the decoder layers whole) and `model` (the forward whole);
`glue` = layers less the parts inside them, `host` = the hooked step (the mean gap between
decode forwards) less the model and the LM head (the engine's or generate's own work). The hooks
cost a few µs a call: the hooked step is longer than the plain one by about that."""
import argparse
import json
import statistics
import time

import torch

from benchmarks.cpu_generate import load_transformers, prompts_of

LAYER_PARTS = ("norms", "qkv", "attention", "o_proj", "gate_up", "act", "down")


class PartTimer:
    """Sums each part's seconds over decode calls (rows == the batch's sequences)."""

    def __init__(self, is_decode):
        self.is_decode = is_decode  # (args, kwargs) of a call -> whether it is a decode
        self.seconds: dict[str, float] = {}
        self.handles, self.unwrap = [], []
        self.model_starts: list[float] = []  # when each decode forward of the model began

    def hook(self, module: torch.nn.Module, part: str) -> None:
        starts = []

        def before(_module, args, kwargs):
            now = time.perf_counter() if self.is_decode(args, kwargs) else None
            if part == "model" and now is not None:
                self.model_starts.append(now)
            starts.append(now)

        def after(_module, _args, _out):
            start = starts.pop()
            if start is not None and self.model_starts:  # from the first decode forward on
                self.seconds[part] = self.seconds.get(part, 0.0) + time.perf_counter() - start
        self.handles += [module.register_forward_pre_hook(before, with_kwargs=True),
                         module.register_forward_hook(after)]

    def wrap(self, owner, method: str, part: str) -> None:
        """Times `owner.method` (a class's: every instance) as `part` in decode calls."""
        original = getattr(owner, method)

        def timed(*args, **kwargs):
            if not self.is_decode(args[1:], kwargs) or not self.model_starts:
                return original(*args, **kwargs)
            start = time.perf_counter()
            out = original(*args, **kwargs)
            self.seconds[part] = self.seconds.get(part, 0.0) + time.perf_counter() - start
            return out
        setattr(owner, method, timed)
        self.unwrap.append((owner, method, original))

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        for owner, method, original in self.unwrap:
            setattr(owner, method, original)


def parashift_parts(model, timer: PartTimer) -> None:
    """The parts, and inside `attention` its `attention.rotary`, `attention.write_kv` and
    `attention.attend` (the torch backend's calls); `attention_block` and `mlp_block` are
    the modules around them (their own work: the split of the QKV output, ...)."""
    from parashift.attention.torch_fast import FastTorchAttentionBackend
    from parashift.layers.attention import Attention
    from parashift.layers.rotary import RotaryEmbedding
    for method in ("write_kv", "attend"):
        timer.wrap(FastTorchAttentionBackend, method, f"attention.{method}")
    for name, module in model.named_modules():
        kind = type(module).__name__
        leaf = name.rsplit(".", 1)[-1]
        if kind == "RMSNorm" and "layers." in name:
            timer.hook(module, "norms")
        elif isinstance(module, Attention):
            timer.hook(module, "attention")
        elif isinstance(module, RotaryEmbedding) and name.endswith("layers.0.self_attn.attn"
                                                                  ".rotary_emb"):
            timer.hook(module, "attention.rotary")  # one module shared by every layer
        elif kind == "LlamaAttention":
            timer.hook(module, "attention_block")
        elif kind == "LlamaMLP":
            timer.hook(module, "mlp_block")
        elif leaf in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
            timer.hook(module, {"qkv_proj": "qkv", "o_proj": "o", "gate_up_proj": "gate_up",
                                "down_proj": "down"}[leaf])
        elif leaf == "act":
            timer.hook(module, "act")
        elif kind == "LlamaDecoderLayer":
            timer.hook(module, "layers")
        elif name == "model":
            timer.hook(module, "model")
        elif name == "lm_head":
            timer.hook(module, "lm_head")


def transformers_parts(model, timer: PartTimer) -> None:
    for name, module in model.named_modules():
        kind, leaf = type(module).__name__, name.rsplit(".", 1)[-1]
        if kind.endswith("RMSNorm") and ".layers." in name:
            timer.hook(module, "norms")
        elif leaf in ("q_proj", "k_proj", "v_proj"):
            timer.hook(module, "qkv")
        elif leaf in ("gate_proj", "up_proj"):
            timer.hook(module, "gate_up")
        elif leaf in ("o_proj", "down_proj", "act_fn"):
            timer.hook(module, {"o_proj": "o", "down_proj": "down", "act_fn": "act"}[leaf])
        elif kind.endswith("Attention"):
            timer.hook(module, "attention_whole")
        elif kind.endswith("DecoderLayer"):
            timer.hook(module, "layers")
        elif name == "model":
            timer.hook(module, "model")
        elif name == "lm_head":
            timer.hook(module, "lm_head")


def engine_runs(name: str, dtype: torch.dtype, batch: int):
    """(run(prompts, new_tokens), the model to hook, the hooker, is_decode)."""
    if name == "parashift":
        from parashift import LLM, SamplingParams
        llm = LLM(device="cpu", dtype=str(dtype).removeprefix("torch."),
                  attention_backend="torch", enable_prefix_caching=False, max_model_len=1024,
                  max_num_seqs=batch)

        def run(prompts, new_tokens):
            params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
            llm.generate(prompts, params, use_tqdm=False)

        def is_decode(args, _kwargs):  # [tokens, ...] inputs: one token a sequence
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            x = next((t for t in tensors if t.dim() >= 2), tensors[0] if tensors else None)
            return x is not None and x.shape[0] == batch
        return run, llm.llm_engine.runner.model, parashift_parts, is_decode
    model = load_transformers(dtype)

    @torch.inference_mode()
    def run(prompts, new_tokens):
        ids = torch.tensor(prompts)
        model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                       max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0,
                       temperature=None, top_p=None, top_k=None)

    def is_decode(args, kwargs):  # [batch, positions, ...] inputs: one position
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        x = next((t for t in tensors if t.is_floating_point() and t.dim() == 3), None)
        x = x if x is not None else kwargs.get("input_ids")
        return x is not None and x.shape[1] == 1
    return run, model, transformers_parts, is_decode


def step_ms(starts: list[float]) -> float:
    """The median time from one decode forward's start to the next's: a decode step, the
    engine's (or generate's) own work included."""
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    return statistics.median(gaps) * 1e3 if gaps else float("nan")


def timed_generate(run, prompts, new_tokens: int, timer: "PartTimer") -> None:
    timer.seconds.clear()
    timer.model_starts.clear()
    run(prompts, new_tokens)


def measure(name: str, dtype: torch.dtype, args) -> dict:
    prompts = prompts_of(args.batch, args.prompt_len)
    run, model, hook_parts, is_decode = engine_runs(name, dtype, args.batch)
    run(prompts, 4)  # warm-up: allocations, oneDNN primitives
    timer = PartTimer(is_decode)
    timer.hook(getattr(model, "model", model), "model")  # one hook a step: the plain steps
    plain = []
    for _ in range(args.repeats):
        timed_generate(run, prompts, args.new_tokens, timer)
        plain.append(step_ms(timer.model_starts))
    timer.remove()
    timer = PartTimer(is_decode)
    hook_parts(model, timer)
    timed_generate(run, prompts, args.new_tokens, timer)
    timer.remove()
    steps = len(timer.model_starts)
    starts = timer.model_starts  # the mean gap, as the parts are means (not the median)
    hooked = (starts[-1] - starts[0]) / max(1, steps - 1) * 1e3
    parts = {k: round(v * 1e3 / steps, 3) for k, v in sorted(timer.seconds.items())}
    if "attention_whole" in parts:  # transformers: its attention less its projections
        parts["attention"] = round(parts.pop("attention_whole") - parts.get("qkv", 0)
                                   - parts.get("o", 0), 3)
    if "o" in parts:
        parts["o_proj"] = parts.pop("o")
    inside = sum(parts.get(k, 0.0) for k in LAYER_PARTS)  # attention.* are inside attention
    parts["glue"] = round(parts.get("layers", 0.0) - inside, 3)
    parts["host"] = round(hooked - parts.get("model", 0.0) - parts.get("lm_head", 0.0), 3)
    return {"decode_step_ms": round(statistics.median(plain), 3),
            "decode_step_ms_runs": [round(x, 3) for x in plain],
            "hooked_step_ms": round(hooked, 3), "decode_steps": steps, "parts_ms": parts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engines", nargs="+", default=["parashift", "transformers"],
                        choices=["parashift", "transformers"])
    parser.add_argument("--output")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    out = {"dtype": args.dtype, "batch": args.batch, "threads": args.threads,
           "new_tokens": args.new_tokens, "engines": {}}
    for name in args.engines:
        out["engines"][name] = measure(name, dtype, args)
        print(name, json.dumps(out["engines"][name]), flush=True)
        if args.output:  # after each engine: a budget cut keeps what was measured
            with open(args.output, "w") as f:
                json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
