import pathlib, sys
sys.path.insert(0, __import__("os").path.dirname(__file__))
from norm_ptx import normal
b, a = pathlib.Path("pdl_before"), pathlib.Path("pdl_after")
names_b = {p.name for p in b.glob("*.ptx")}; names_a = {p.name for p in a.glob("*.ptx")}
print("only before:", sorted(names_b - names_a), "only after:", sorted(names_a - names_b))
same = []; differ = []
for n in sorted(names_a & names_b):
    (same if normal((b/n).read_text()) == normal((a/n).read_text()) else differ).append(n)
print(len(same), "identical;", "differ:", differ)
