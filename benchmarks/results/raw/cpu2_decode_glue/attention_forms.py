import time, statistics, torch, torch.nn.functional as F
torch.set_num_threads(1); torch.manual_seed(0)
def rnd(f, n=100):
    s = time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter() - s) / n * 1e6
for dt in (torch.float32, torch.bfloat16):
    L = 96
    q = torch.randn(16, 3, 3, 64, dtype=dt); k = torch.randn(16, 3, L, 64, dtype=dt); v = torch.randn_like(k)
    kt = k.transpose(-1, -2).contiguous()  # [16,3,64,L]
    q48, kt48, v48 = q.reshape(48, 3, 64), kt.reshape(48, 64, L), v.reshape(48, L, 64)
    ref = F.scaled_dot_product_attention(q, k, v, scale=0.125)
    def sdpa(): return F.scaled_dot_product_attention(q, k, v, scale=0.125)
    def bmm_t():  # in q's dtype, softmax fp32
        s = torch.bmm(q48, kt48)
        p = torch.softmax(s.float().mul_(0.125), -1).to(dt)
        return torch.bmm(p, v48)
    def bmm_t32():
        if dt == torch.float32:
            s = torch.bmm(q48, kt48).mul_(0.125)
            return torch.bmm(s.softmax(-1), v48)
        s = torch.bmm(q48.float(), kt48.float()).mul_(0.125)
        return torch.bmm(s.softmax(-1), v48.float()).to(dt)
    fs = dict(sdpa=sdpa, bmm_t=bmm_t, bmm_t32=bmm_t32)
    for f in fs.values(): rnd(f, 10)
    S = {n: [] for n in fs}
    for _ in range(7):
        for n, f in fs.items(): S[n].append(rnd(f))
    for n, f in fs.items():
        d = (f().reshape(ref.shape).float() - ref.float()).abs().max().item()
        print(dt, n, round(statistics.median(S[n]), 1), "us; maxdiff", d, [round(x) for x in S[n]])
