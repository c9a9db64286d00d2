"""Per-step control-channel cost: pickle against the binary step codec
(`parashift/step/codec.py`).

A run of decode steps at a fixed batch (each chunk one token, uuid request ids, a block
appended to a request's table every 16th position, the first step admitting every
request with its sampling parameters) is encoded in this process and sent over a
multiprocessing Pipe to N receiver processes, which decode it and answer with the time
at which they were done. A step's cost is from the start of its encoding to the last
receiver's end of decoding; the next step is sent once every receiver has answered.
Receivers do no model work. Times are medians over all steps (and rounds).

Usage: python benchmarks/control_overhead.py --batch 256 --steps 1024 --receivers 2 4 \
           --out control_overhead.json"""
import argparse
import json
import multiprocessing as mp
import pickle
import platform
import random
import statistics
import struct
import time
import uuid

from parashift.sampling_params import SamplingParams
from parashift.step.codec import decode_step, encode_step
from parashift.step.encoder import DeltaEncoder
from parashift.step.message import StepBatch

CODECS = {"pickle": (pickle.dumps, pickle.loads), "binary": (encode_step, decode_step)}
BLOCK_SIZE, VOCAB = 16, 128_256


def receiver(conn, codec: str) -> None:
    decode = CODECS[codec][1]
    while (message := conn.recv_bytes()) != b"stop":
        start = time.perf_counter()
        decode(message)
        end = time.perf_counter()
        conn.send_bytes(struct.pack("<dd", end, end - start))


def decode_steps(batch: int, steps: int, seed: int = 0) -> list[StepBatch]:
    rng = random.Random(seed)
    encoder, ids = DeltaEncoder(), [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(batch)]
    positions = [rng.randrange(64, 2048) for _ in ids]
    tables = [list(range(i * 1000, i * 1000 + p // BLOCK_SIZE + 1)) for i, p in enumerate(positions)]
    params = {r: SamplingParams(temperature=rng.choice([0.0, 0.7, 1.0]), top_p=0.95, top_k=50,
                                seed=rng.choice([None, rng.getrandbits(63)]), max_tokens=4096)
              for r in ids}
    out = []
    for step in range(steps):
        chunks = []
        for i, r in enumerate(ids):
            pos = positions[i] + step
            if pos % BLOCK_SIZE == 0 and pos // BLOCK_SIZE >= len(tables[i]):
                tables[i].append(tables[i][-1] + 1)
            chunks.append(encoder.chunk(r, [rng.randrange(VOCAB)], pos, tables[i], True))
        out.append(StepBatch(chunks, params if step == 0 else {}))
    return out


def run_channel(codec: str, receivers: int, steps: list[StepBatch]) -> list[dict]:
    ctx = mp.get_context("spawn")
    conns, procs = [], []
    for _ in range(receivers):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=receiver, args=(child, codec), daemon=True)
        proc.start()
        conns.append(parent)
        procs.append(proc)
    encode, rows = CODECS[codec][0], []
    for batch in steps[:1] + steps:  # the first step again, untimed, to warm the receivers
        start = time.perf_counter()
        payload = encode(batch)
        encoded = time.perf_counter()
        for conn in conns:
            conn.send_bytes(payload)
        sent = time.perf_counter()
        answers = [struct.unpack("<dd", conn.recv_bytes()) for conn in conns]
        rows.append({"bytes": len(payload), "encode": encoded - start, "send": sent - encoded,
                     "decode": max(d for _, d in answers),
                     "step": max(end for end, _ in answers) - start})
    for conn in conns:
        conn.send_bytes(b"stop")
    for proc in procs:
        proc.join()
    return rows[1:]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=1024)
    p.add_argument("--receivers", type=int, nargs="+", default=[2, 4])
    p.add_argument("--rounds", type=int, default=3, help="alternate the codecs this many times")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()
    steps = decode_steps(args.batch, args.steps)
    results = []
    print(f"batch {args.batch}, {args.steps} decode steps x {args.rounds} rounds; median per step")
    print("| receivers | codec | payload (B) | encode (µs) | send (µs) | decode (µs) | "
          "step (µs) | p90 step (µs) |\n|---:|---|---:|---:|---:|---:|---:|---:|")
    for receivers in args.receivers:
        rows = {codec: [] for codec in CODECS}
        for _ in range(args.rounds):
            for codec in CODECS:
                rows[codec] += run_channel(codec, receivers, steps)
        for codec, samples in rows.items():
            med = {k: statistics.median(r[k] for r in samples)
                   for k in ("bytes", "encode", "send", "decode", "step")}
            p90 = sorted(r["step"] for r in samples)[int(0.9 * len(samples))]
            results.append({"receivers": receivers, "codec": codec, "median_bytes": med["bytes"],
                            **{f"median_{k}_us": 1e6 * med[k]
                               for k in ("encode", "send", "decode", "step")},
                            "p90_step_us": 1e6 * p90, "first_step_bytes": samples[0]["bytes"]})
            print(f"| {receivers} | {codec} | {med['bytes']:.0f} | {1e6 * med['encode']:.0f} | "
                  f"{1e6 * med['send']:.0f} | {1e6 * med['decode']:.0f} | "
                  f"{1e6 * med['step']:.0f} | {1e6 * p90:.0f} |", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"batch": args.batch, "steps": args.steps, "rounds": args.rounds,
                       "machine": platform.platform(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
