"""Per-file and per-test sums (setup+call+teardown) of a procspy durations.jsonl."""
import json, sys
from collections import defaultdict
rows = [json.loads(l) for l in open(sys.argv[1])]
tests, files, failed = defaultdict(float), defaultdict(float), []
for r in rows:
    tests[r["id"]] += r["s"]
    files[r["id"].split("::")[0]] += r["s"]
    if r["outcome"] == "failed":
        failed.append((r["id"], r["when"]))
for f, s in sorted(files.items(), key=lambda x: -x[1]):
    print(f"{s:8.1f}  {f}")
print(f"{sum(files.values()):8.1f}  total ({len(tests)} tests)")
if "-v" in sys.argv:
    for t, s in sorted(tests.items(), key=lambda x: -x[1]):
        print(f"   {s:8.1f}  {t}")
print("failed:", failed)
