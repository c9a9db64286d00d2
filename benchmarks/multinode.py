"""Two "hosts" against one: decode step time of PP=2 and DP=2 launched on one node (both
ranks children of the engine) and on two (`--nnodes 2`: node 1 a separate `parashift
serve --node-rank 1` process driving its rank, the control channel and the rendezvous over
TCP), and the control channel's latency per step (pipe against TCP).

On nvidia-h200-x2 each "node" gets one GPU (CUDA_VISIBLE_DEVICES) and NCCL is kept off
its intra-host paths (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1), so activations cross the
network stack as between hosts. Random weights (speed only).

Step time: the median of the engine's decode steps (every sequence one token; a replica's
or a stage's, as the engine records them: submit to result, the channel included) at each
batch size (keep --context above the batch sizes).
Channel latency: a decode step's message (the binary step codec) sent to each rank and
decoded there, to the answer back, with no model work (benchmarks/control_overhead.py's
receivers, over a pipe or over TCP with the cluster handshake).

Usage (GPU): python3 benchmarks/multinode.py --model benchmarks/shapes/llama-3.1-8b.json \
    --plans pp2 dp2 --batch-sizes 1 64 --out multinode.json
CPU check:   python3 benchmarks/multinode.py --device cpu --model \
    benchmarks/shapes/tiny-llama.json --batch-sizes 1 4 --decode-steps 8 --context 32"""
import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import time

# NCCL and gloo through the socket stack (loopback on one machine), as between hosts
NETWORK_ONLY = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1",
                "NCCL_SOCKET_IFNAME": os.environ.get("NCCL_SOCKET_IFNAME", "lo"),
                "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
PLANS = {"pp2": {"pipeline_parallel_size": 2}, "dp2": {"data_parallel_size": 2}}
PLAN_FLAGS = {"pp2": ["-pp", "2"], "dp2": ["-dp", "2"]}


def free_port_pair() -> int:
    """A port whose next one is free too (rendezvous, control channel)."""
    while True:
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
        try:
            with socket.socket() as second:
                second.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue


def run_launch(args) -> dict:
    """One launch (this process is node 0): its step times by batch size."""
    from parashift import LLM, SamplingParams
    options = dict(model=args.model, device=args.device, load_format="dummy",
                   max_model_len=args.context + args.decode_steps + 16,
                   enable_prefix_caching=False, **PLANS[args.plan])
    if args.nnodes == 2:
        options.update(nnodes=2, master_port=args.master_port)
    llm = LLM(**options)
    engine = llm.llm_engine
    steps = {}
    try:
        for batch in args.batch_sizes:
            prompts = [[(7 * i + j) % 400 + 10 for j in range(args.context)] for i in range(batch)]
            params = SamplingParams(temperature=0, max_tokens=args.decode_steps, ignore_eos=True)
            llm.generate(prompts, params, use_tqdm=False)  # warm-up
            engine.take_step_records()
            llm.generate(prompts, params, use_tqdm=False)
            # decode steps: a token per sequence (a prompt's chunk holds more: context > batch)
            decode = [r.seconds for r in engine.take_step_records() if r.num_tokens <= batch]
            steps[batch] = {"median_step_ms": 1e3 * statistics.median(decode),
                            "steps": len(decode)}
    finally:
        engine.shutdown()
    return steps


def launch(args, plan: str, nnodes: int) -> dict:
    """Runs one launch in fresh processes (each launch its own CUDA_VISIBLE_DEVICES)."""
    port = free_port_pair()
    env = {**os.environ, **(NETWORK_ONLY if nnodes == 2 and args.device == "cuda" else {})}
    node1 = None
    if nnodes == 2:
        node1 = subprocess.Popen(
            [sys.executable, "-m", "parashift.entrypoints.openai", "serve", "--device",
             args.device, "--nnodes", "2", "--node-rank", "1", "--master-port", str(port),
             "--model", args.model, "--load-format", "dummy", *PLAN_FLAGS[plan]],
            env={**env, "CUDA_VISIBLE_DEVICES": "1"} if args.device == "cuda" else env)
    node0_env = {**env, "CUDA_VISIBLE_DEVICES": "0" if nnodes == 2 else "0,1"} \
        if args.device == "cuda" else env
    command = [sys.executable, __file__, "--launch", plan, "--nnodes", str(nnodes),
               "--master-port", str(port), "--model", args.model, "--device", args.device,
               "--context", str(args.context), "--decode-steps", str(args.decode_steps),
               "--batch-sizes", *map(str, args.batch_sizes)]
    try:
        out = subprocess.run(command, env=node0_env, capture_output=True, text=True, check=True)
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"launch {plan} on {nnodes} node(s) failed:\n{e.stderr[-4000:]}")
    finally:
        if node1 is not None:
            node1.wait(timeout=60)
    return json.loads(out.stdout.strip().splitlines()[-1])


def tcp_receiver(address, rank: int) -> None:
    from benchmarks.control_overhead import receiver
    from parashift.executor.node_link import connect
    receiver(connect(address, ("rank", rank)), "binary")


def channel_latency(transport: str, receivers: int, batch: int, steps: int) -> dict:
    """Median microseconds from encoding a decode step to the last receiver's answer."""
    from benchmarks.control_overhead import decode_steps, receiver
    from parashift.executor.node_link import accept_ranks
    from parashift.step.codec import encode_step
    ctx, conns, procs = mp.get_context("spawn"), [], []
    if transport == "pipe":
        for _ in range(receivers):
            parent, child = ctx.Pipe()
            procs.append(ctx.Process(target=receiver, args=(child, "binary"), daemon=True))
            conns.append(parent)
        for proc in procs:
            proc.start()
    else:
        port = free_port_pair()
        procs = [ctx.Process(target=tcp_receiver, args=(("127.0.0.1", port), r), daemon=True)
                 for r in range(receivers)]
        for proc in procs:
            proc.start()
        _, by_rank = accept_ranks(("127.0.0.1", port), set(range(receivers)), 60)
        conns = [by_rank[r] for r in range(receivers)]
    times = []
    for batch_msg in decode_steps(batch, steps + 1):
        start = time.perf_counter()
        payload = encode_step(batch_msg)
        for conn in conns:
            conn.send_bytes(payload)
        for conn in conns:
            conn.recv_bytes()
        times.append(time.perf_counter() - start)
    for conn in conns:
        conn.send_bytes(b"stop")
    for proc in procs:
        proc.join(5)
    return {"median_us": 1e6 * statistics.median(times[1:]), "bytes": len(payload)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="benchmarks/shapes/llama-3.1-8b.json")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--plans", nargs="+", default=["pp2", "dp2"], choices=sorted(PLANS))
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 64])
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--channel-steps", type=int, default=256)
    parser.add_argument("--out", default=None)
    parser.add_argument("--launch", default=None, help=argparse.SUPPRESS)  # one launch, inside
    parser.add_argument("--nnodes", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--master-port", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.launch:
        args.plan = args.launch
        print(json.dumps(run_launch(args)))
        return
    result = {"model": args.model, "device": args.device, "context": args.context,
              "launches": {}, "channel": {}}
    for plan in args.plans:
        for nnodes in (1, 2):
            name = f"{plan}-{nnodes}node"
            result["launches"][name] = launch(args, plan, nnodes)
            print(name, json.dumps(result["launches"][name]), flush=True)
    for batch in args.batch_sizes:
        for transport in ("pipe", "tcp"):
            name = f"{transport}-batch{batch}"
            result["channel"][name] = channel_latency(transport, 1, batch, args.channel_steps)
            print("channel", name, json.dumps(result["channel"][name]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
