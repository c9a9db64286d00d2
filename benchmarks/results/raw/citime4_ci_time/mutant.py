"""The float32 quality test's FP8-weights ratio with a broken quantization: each row's scale
half the right one (its top half saturates). Its first form (one scale per tensor:
`amax()` over the whole weight, expanded to the rows) gave 1.0054x (mutants.txt)."""
import sys, torch
sys.path.insert(0, "benchmarks")
torch.set_num_threads(1)
from parashift.quantization import fp8, loading
FP8_MAX = fp8.FP8_MAX
def per_tensor(weight):
    w = weight.float()
    scale = w.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / FP8_MAX * 0.5  # saturates the top half
    return (w / scale).clamp(-FP8_MAX, FP8_MAX).to(fp8.FP8), scale
fp8.quantize_rows = loading.quantize_rows = per_tensor
import fp8_quality as q
llm = q.load(quantization="fp8", dtype="float32")
p = q.perplexity(llm, q.TEXT.read_text())
print({"half-scale fp8 weights ppl": round(p, 4), "ratio to float32 18.3633": round(p / 18.3633, 4)})
