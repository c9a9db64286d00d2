import sys, collections
sys.path.insert(0, "/work/wt/citime3")
from tests.xdist_groups import unit_of
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
start = min(float(r[0]) - float(r[4]) for r in rows)
busy = collections.defaultdict(float); end = {}; units = collections.defaultdict(float)
unit_worker = {}; unit_end = {}; unit_first = {}
for t, w, when, outcome, d, node in rows:
    t, d = float(t), float(d)
    busy[w] += d; end[w] = max(end.get(w, 0), t - start)
    u = unit_of(node); units[u] += d; unit_worker[u] = w
    unit_end[u] = max(unit_end.get(u, 0), t - start)
    unit_first[u] = min(unit_first.get(u, 1e18), t - d - start)
for w in sorted(busy):
    print(f"worker {w}: busy {busy[w]:.0f} s, last report at {end[w]:.0f} s")
print("procs:", round(units.get("procs", 0)), "in-process:", round(sum(v for k, v in units.items() if k != "procs")))
print("units by end time (last 12):")
for u in sorted(unit_end, key=unit_end.get)[-12:]:
    print(f"  {unit_worker[u]} {unit_first[u]:7.0f} -> {unit_end[u]:7.0f}  {units[u]:6.1f} s  {u}")
print("largest units:")
for u, s in sorted(units.items(), key=lambda x: -x[1])[:20]:
    print(f"  {s:7.1f} {unit_worker[u]} {u}")
