"""One token of CPU inference: normlab.nn against torch.nn module calls on (1, d) under no_grad,
one thread, the minimum over repeats, three runs interleaved (docs/performance.md, "Small calls").

    python scripts/bench-one-token.py
"""
import time, torch, normlab
torch.set_num_threads(1)
def bench(f, n=5000):
    for _ in range(500): f()
    best = 1e9
    for _ in range(9):
        t = time.perf_counter()
        for _ in range(n): f()
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e6
with torch.no_grad():
    for name, a, b, d in [("LayerNorm(768)", torch.nn.LayerNorm(768), normlab.nn.LayerNorm(768), 768),
                          ("RMSNorm(2048)", torch.nn.RMSNorm(2048), normlab.nn.RMSNorm(2048), 2048),
                          ("RMSNorm(4096)", torch.nn.RMSNorm(4096), normlab.nn.RMSNorm(4096), 4096)]:
        x = torch.randn(1, d)
        r = [(bench(lambda: a(x)), bench(lambda: b(x))) for _ in range(3)]
        print(name, " ".join(f"torch {t:.2f} normlab {n:.2f}" for t, n in r))
