"""Per-step control-channel cost: the engine pickles a step once and sends it over
local pipes to every rank; the output rank sends back sampled tokens. Measures the
round trip with workers that do no model work, for decode steps of B sequences.

Usage: python3 benchmarks/control_overhead.py --ranks 2 --batch-sizes 1 64 256"""
import argparse
import multiprocessing as mp
import pickle
import statistics
import time

from parashift.worker.step_batch import DeltaEncoder, StepBatch
from parashift.sampling_params import SamplingParams


def echo_worker(conn, is_output: bool) -> None:
    while True:
        message = conn.recv_bytes()
        if message == b"stop":
            return
        batch = pickle.loads(message)
        if is_output:
            tokens = [0] * sum(c.samples for c in batch.chunks)
            conn.send_bytes(pickle.dumps(("result", (tokens, None))))


def decode_batches(batch_size: int, context: int = 1024, block_size: int = 16):
    """The first message of a batch of running requests (whole tables, parameters) and
    a steady decode step's message (no new block: 15 of 16 decode steps)."""
    encoder, per_seq = DeltaEncoder(), context // block_size + 1
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(batch_size)]
    params = {str(i): SamplingParams(temperature=0, max_tokens=256) for i in range(batch_size)}

    def step():
        return StepBatch([encoder.chunk(str(i), [1], context, tables[i], True)
                          for i in range(batch_size)])
    first = step()
    first.new_params = params
    return first, step()


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
        for kind, batch in zip(("first", "steady"), decode_batches(batch_size)):
            round_trips(conns, batch, 20)
            times = round_trips(conns, batch, args.steps)
            print(f"ranks {args.ranks} batch {batch_size:4d} {kind:6s}: payload "
                  f"{len(pickle.dumps(batch)):7d} B, round trip median "
                  f"{1e6 * statistics.median(times):7.1f} us, p99 "
                  f"{1e6 * sorted(times)[int(0.99 * len(times))]:7.1f} us", flush=True)
    for conn in conns:
        conn.send_bytes(b"stop")
    for proc in procs:
        proc.join()


if __name__ == "__main__":
    main()
