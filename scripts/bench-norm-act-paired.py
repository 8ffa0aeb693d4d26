"""BatchNormAct2d against the plain BatchNorm2d and against the unfused torch path (torch's
BatchNorm2d, then the activation Module in place, as timm builds it), forward+backward, in one
process on the same tensors: each round calls the three in turn (the order rotated and reversed
from round to round), 15 calls each, and keeps the lower quartile; the least of 8 rounds is
reported. One thread: the calling thread's CPU time (a loaded machine moves it less than wall
time); TH=2: wall time.

    python scripts/bench-norm-act-paired.py 16x64x56x56:float32:train 16x64x56x56:float32:eval
    ACT=silu python scripts/bench-norm-act-paired.py 32x256x14x14:bfloat16:train

Each argument: shape:dtype:mode (mode train or eval). Prints the three times in ms, fused / plain
and unfused / fused (x unfused).
"""
from __future__ import annotations

import os
import sys
import time

import torch

import normlab.nn as nnn

ACTS = {"relu": lambda: torch.nn.ReLU(inplace=True), "silu": lambda: torch.nn.SiLU(inplace=True),
        "gelu": lambda: torch.nn.GELU()}


def main(specs: list[str]) -> None:
    torch.set_num_threads(int(os.environ.get("TH", "1")))
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    act = os.environ.get("ACT", "relu")
    for spec in specs:
        shp, dt, mode = spec.split(":")
        shape = tuple(map(int, shp.split("x")))
        d = getattr(torch, dt)
        x = torch.randn(shape).to(d).requires_grad_()
        dy = torch.randn(shape).to(d)
        fused = nnn.BatchNormAct2d(shape[1], act_layer=act).to(d)
        plain = nnn.BatchNorm2d(shape[1]).to(d)
        norm, fn = torch.nn.BatchNorm2d(shape[1]).to(d), ACTS[act]()
        for m in (fused, plain, norm):
            m.train(mode == "train")

        def unfused(t):
            return fn(norm(t))

        def timed(m, n=15):
            ts = []
            for _ in range(n):
                t = clock()
                m(x).backward(dy)
                x.grad = None
                ts.append(clock() - t)
            ts.sort()
            return ts[n // 4] * 1e3

        contenders = [("fused", fused), ("plain", plain), ("unfused", unfused)]
        best = {k: float("inf") for k, _ in contenders}
        for r in range(8):
            order = contenders[r % 3:] + contenders[:r % 3]
            for k, m in order if r % 2 == 0 else order[::-1]:
                best[k] = min(best[k], timed(m))
        a, p, u = best["fused"], best["plain"], best["unfused"]
        print(f"{spec} {act}: fused {a:.3f} ms, plain {p:.3f} ms, unfused {u:.3f} ms; fused / plain {a / p:.2f}, "
              f"x unfused {u / a:.2f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
