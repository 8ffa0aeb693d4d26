"""DyT against torch's unfused DyT (the paper's module: tanh(alpha * x) * weight + bias in torch
ops) and against LayerNorm, normlab's and torch's: forward (no grad) and forward+backward, one
thread, CPU time of the calling thread, median of 7 repeats (docs/derivations/dyt.md, "Speed").

    python scripts/bench-dyt.py
"""
import time

import torch

import normlab

torch.set_num_threads(1)
clock = time.thread_time


def bench(f, n):
    for _ in range(3):
        f()
    ts = []
    for _ in range(7):
        t = clock()
        for _ in range(n):
            f()
        ts.append((clock() - t) / n)
    return sorted(ts)[3] * 1e6


class TorchDyT(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.alpha = torch.nn.Parameter(torch.full((1,), 0.5))
        self.weight = torch.nn.Parameter(torch.ones(d))
        self.bias = torch.nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return torch.tanh(self.alpha * x) * self.weight + self.bias


for rows, d in [(1, 768), (8, 768), (512, 768), (4096, 1024), (64, 4096)]:
    for dt in (torch.float32, torch.bfloat16):
        x = torch.randn(rows, d, dtype=dt)
        n = max(3, int(2e6 / (rows * d)))
        mods = {"normlab DyT": normlab.nn.DyT(d).to(dt), "torch DyT": TorchDyT(d).to(dt),
                "normlab LayerNorm": normlab.nn.LayerNorm(d).to(dt), "torch LayerNorm": torch.nn.LayerNorm(d).to(dt)}
        res = {}
        with torch.no_grad():
            for k, m in mods.items():
                res[k] = bench(lambda: m(x), n)
        xg, dy = x.clone().requires_grad_(), torch.randn_like(x)
        for k in ("normlab DyT", "torch DyT", "normlab LayerNorm"):
            res[k + " fwd+bwd"] = bench(lambda: mods[k](xg).backward(dy), max(2, n // 3))
        print(f"{rows}x{d} {str(dt)[6:]:9s} " + "  ".join(f"{k} {v:.1f} us" for k, v in res.items()), flush=True)
