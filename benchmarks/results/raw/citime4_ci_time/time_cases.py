"""Times each interpreted case of module.check (CPU process time), one process."""
import importlib, json, sys, time
from tests.kernels import common
module, check, cases_json = sys.argv[1], sys.argv[2], sys.argv[3]
mod = importlib.import_module(module)
fn = getattr(mod, check)
cases = json.loads(cases_json) if cases_json != "-" else None
for case in cases:
    t = time.process_time(); w = time.time()
    err = common._run_case(fn, case)
    print(json.dumps({"case": case, "cpu_s": round(time.process_time() - t, 2), "wall_s": round(time.time() - w, 2), "ok": err is None}), flush=True)
    if err: print(err[-2000:])
