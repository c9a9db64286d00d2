"""Self-healing's time to recover: a worker of an idle engine SIGKILLed, then the seconds
until its loss is seen, until its group serves again and until the node is one torch world
again (re-formed: engine/node_reform.py), and whether greedy tokens are the same as before
the kill; one JSON line per kill.

    python benchmarks/recovery_time.py --device cpu --dp 2 --tp 1          # embedded SmolLM2
    python benchmarks/recovery_time.py --model benchmarks/shapes/llama-3.1-8b.json --dp 2 --tp 4"""
import argparse
import json
import os
import signal
import time

from parashift import LLM, SamplingParams
from parashift.engine.node_reform import needs_one_world


def kill_and_wait(engine, rank: int) -> tuple[float, float, float]:
    """Seconds from the kill until the group is out, until it serves again, and until the
    node is one world again (where a plan of its policy needs that)."""
    os.kill(engine.executor.procs[rank].pid, signal.SIGKILL)
    killed = time.monotonic()
    while not engine.faults.groups_down:
        engine.check_health()
        time.sleep(0.01)
    seen = time.monotonic() - killed
    while engine.faults.groups_down or engine.faults.ranks_alive < engine.layout.world_size:
        engine.check_health()
        time.sleep(0.01)
    back = time.monotonic() - killed
    while (len(engine.node.worlds) > 1 and needs_one_world(engine.node)
           and getattr(engine.executor, "can_reform", False)):
        engine.check_health()
        time.sleep(0.01)
    return seen, back, time.monotonic() - killed


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=None, help="default: the embedded SmolLM2")
    p.add_argument("--device", default=None)
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 0], help="the ranks to kill")
    p.add_argument("--deterministic", action="store_true",
                   help="batch-invariant kernels: tokens may not depend on how requests batch")
    args = p.parse_args()
    options = dict(data_parallel_size=args.dp, tensor_parallel_size=args.tp,
                   skip_tokenizer_init=args.model is not None, deterministic=args.deterministic)
    if args.device:
        options["device"] = args.device
    llm = LLM(args.model, **options)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = [[1 + i, 2 + i, 3 + i] for i in range(4 * args.dp)]
    before = [out.outputs[0].token_ids for out in llm.generate(prompts, params)]
    # without a kill: are the tokens stable from run to run (batching can differ)?
    again = [out.outputs[0].token_ids for out in llm.generate(prompts, params)]
    try:
        for rank in args.ranks:
            seen, back, one_world = kill_and_wait(llm.llm_engine, rank)
            after = [out.outputs[0].token_ids for out in llm.generate(prompts, params)]
            print(json.dumps({"dp": args.dp, "tp": args.tp, "rank": rank, "lost_seen_s": seen,
                              "serving_again_s": back, "one_world_s": one_world,
                              "reform_s": llm.llm_engine.node.reforming.seconds,
                              "same_tokens": after == before,
                              "prompts_differing": sum(a != b for a, b in zip(after, before)),
                              "same_tokens_without_kill": again == before,
                              "deterministic": args.deterministic,
                              "recovery_seconds": llm.llm_engine.faults.recovery_seconds}),
                  flush=True)
    finally:
        llm.shutdown()


if __name__ == "__main__":
    main()
