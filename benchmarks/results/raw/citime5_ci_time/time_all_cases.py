"""Times each interpreted case of each check the given test modules register (CPU process
time), one process per module, under the Triton interpreter's environment."""
import importlib, json, sys, time
from tests.kernels import common
for module in sys.argv[1:]:
    importlib.import_module(module)
for (module, check), cases in list(common._CASES.items()):
    fn = getattr(sys.modules[module], check)
    for i, case in enumerate(cases):
        t = time.process_time()
        err = common._run_case(fn, case)
        print(json.dumps({"module": module, "check": check, "i": i, "case": case,
                          "cpu_s": round(time.process_time() - t, 2), "ok": err is None}),
              flush=True)
