import time, torch, sys
torch.set_num_threads(1)
from tests.helpers import hf_smollm2 as h
import transformers
from parashift.loader.source import embedded_gguf_path
p = h._cache_path(embedded_gguf_path(), transformers.__version__)
print("cache exists", p.exists(), p)
t = time.process_time(); a = h.hf_smollm2(); print("first cpu", round(time.process_time() - t, 1))
t = time.process_time(); b = h.hf_smollm2(); print("second cpu", round(time.process_time() - t, 1))
print(type(a).__name__, type(b).__name__, a.training, b.training)
sa, sb = a.state_dict(), b.state_dict()
print("same keys", sa.keys() == sb.keys(), "equal", all(torch.equal(sa[k], sb[k]) for k in sa))
print("tied", b.lm_head.weight.data_ptr() == b.model.embed_tokens.weight.data_ptr(), a.lm_head.weight.data_ptr() == a.model.embed_tokens.weight.data_ptr())
ids = torch.tensor([[1, 504, 3458, 314, 2942, 282]])
with torch.inference_mode():
    print("logits equal", torch.equal(a(ids).logits, b(ids).logits))
print(a.config == b.config, a.generation_config.to_dict() == b.generation_config.to_dict())
