"""Per-step control-channel cost: the engine pickles a step once and sends it over
local pipes to every rank; the output rank sends back sampled tokens. Measures the
round trip with workers that do no model work, for decode steps of B sequences.

Usage: python3 benchmarks/control_overhead.py --ranks 2 --batch-sizes 1 64 256"""
import argparse
import multiprocessing as mp
import pickle
import statistics
import time

from parashift.engine.step_batch import SeqChunk, StepBatch
from parashift.sampling_params import SamplingParams


def echo_worker(conn, is_output: bool) -> None:
    while True:
        message = conn.recv_bytes()
        if message == b"stop":
            return
        batch = pickle.loads(message)
        if is_output:
            tokens = [0] * len(batch.sampling_chunks)
            conn.send_bytes(pickle.dumps(("result", (tokens, None))))


def decode_batch(batch_size: int, context: int = 1024, block_size: int = 16) -> StepBatch:
    per_seq = context // block_size + 1  # distinct tables, as real sequences have
    return StepBatch([SeqChunk(str(i), [1], context, list(range(i * per_seq, (i + 1) * per_seq)),
                               SamplingParams(temperature=0, max_tokens=256))
                      for i in range(batch_size)])


def round_trips(conns, batch: StepBatch, n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        payload = pickle.dumps(batch)
        for conn in conns:
            conn.send_bytes(payload)
        pickle.loads(conns[0].recv_bytes())
        times.append(time.perf_counter() - start)
    return times


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64, 256])
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    conns, procs = [], []
    for rank in range(args.ranks):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=echo_worker, args=(child, rank == 0), daemon=True)
        proc.start()
        conns.append(parent)
        procs.append(proc)
    for batch_size in args.batch_sizes:
        batch = decode_batch(batch_size)
        round_trips(conns, batch, 20)
        times = round_trips(conns, batch, args.steps)
        print(f"ranks {args.ranks} batch {batch_size:4d}: payload {len(pickle.dumps(batch)):7d} B, "
              f"round trip median {1e6 * statistics.median(times):7.1f} us, "
              f"p99 {1e6 * sorted(times)[int(0.99 * len(times))]:7.1f} us", flush=True)
    for conn in conns:
        conn.send_bytes(b"stop")
    for proc in procs:
        proc.join()


if __name__ == "__main__":
    main()
