import sys, time, json, torch
sys.path.insert(0, "benchmarks")
torch.set_num_threads(1)
import fp8_quality as q
dtype = sys.argv[1]
text = q.TEXT.read_text()
if len(sys.argv) > 2:
    text = text[:int(sys.argv[2])]
res = {}
for name, opts in [("base", {}), ("fp8 weights", dict(quantization="fp8")), ("fp8 weights + fp8 KV", dict(quantization="fp8", kv_cache_dtype="fp8"))]:
    t = time.process_time(); w = time.time()
    llm = q.load(**{**opts, "dtype": dtype})
    tl = time.process_time() - t
    p = q.perplexity(llm, text)
    llm.llm_engine.shutdown()
    res[name] = p
    print(json.dumps({"dtype": dtype, "config": name, "ppl": round(p, 4), "ratio": round(p / res["base"], 4), "load_cpu_s": round(tl, 1), "cpu_s": round(time.process_time() - t, 1), "wall_s": round(time.time() - w, 1)}), flush=True)
