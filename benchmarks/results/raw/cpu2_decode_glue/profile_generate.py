import sys, time, json, torch
torch.set_num_threads(2)
from parashift import LLM, SamplingParams
from benchmarks.cpu_generate import prompts_of
dtype = sys.argv[1] if len(sys.argv) > 1 else "bfloat16"
llm = LLM(device="cpu", dtype=dtype, attention_backend="torch", enable_prefix_caching=False,
          max_model_len=1024, max_num_seqs=16)
prompts = prompts_of(16, 64)
def gen(n):
    p = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, p, use_tqdm=False)]
gen(4)
ts = []
for _ in range(3):
    t = time.perf_counter(); toks = gen(32); ts.append(time.perf_counter() - t)
print("gen32 s", sorted(ts))
json.dump(toks, open(f"/tmp/cpu2/toks_{dtype}_{sys.argv[2] if len(sys.argv)>2 else 'x'}.json", "w"))
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU]) as prof:
    gen(16)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
