"""sm_90 PTX of every kernel in tests/kernels/test_pdl.py's KERNELS table (PDL early), compiled
on the CPU, written to OUTDIR/<name>.ptx. Usage (tree root): PYTHONPATH=. python ptx_pdl_table.py OUTDIR"""
import os, sys
from concurrent.futures import ProcessPoolExecutor
from tests.kernels import test_pdl as t

def one(name):
    kernel, pointers, floats, constexprs, _ = t.KERNELS[name]
    try:
        ptx = t.sm90_ptx(kernel, pointers, floats, constexprs, t.pdl.EARLY)
    except Exception as e:
        return name, f"ERROR {type(e).__name__}: {e}"[:200]
    open(os.path.join(sys.argv[1], name + ".ptx"), "w").write(ptx)
    return name, "ok"

if __name__ == "__main__":
    os.makedirs(sys.argv[1], exist_ok=True)
    with ProcessPoolExecutor(2) as pool:
        for name, status in pool.map(one, sorted(t.KERNELS)):
            print(name, status)
