"""Norm + activation: normlab's fused layers against the unfused torch/timm path (timm's classes, as
the faithful stand-ins in tests/tools/timm_norm_act_standins.py: torch's norm, then the activation
Module, inplace as timm builds it) and against normlab's plain norm (no activation).

Interleaved in one process on the same tensors: each repeat times normlab, then timm, then the
plain norm, one after the other; wall time per call, the median of the repeats after warm-up.
Both layouts (NCHW, channels_last), float32 and bfloat16, 1 and 2 threads, forward (train mode,
no grad) and forward+backward. ``speedup`` = timm / normlab; ``vs plain`` = normlab / plain norm.

    python scripts/bench-norm-act.py                 # BatchNormAct2d and GroupNormAct, relu and silu
    python scripts/bench-norm-act.py --kinds LayerNormAct2d,LayerNormAct --acts gelu --threads 1
    python scripts/bench-norm-act.py --memory        # the peak memory of one fwd+bwd call, each side in
                                                     # a fresh process (VmHWM after clear_refs)
    python scripts/bench-norm-act.py --threads 1 --cpu-time   # the thread's CPU time, not wall time
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import normlab  # noqa: E402
from tests.tools import timm_norm_act_standins as T  # noqa: E402

SHAPES = [(16, 64, 56, 56), (32, 256, 14, 14)]
KINDS = ("BatchNormAct2d", "GroupNormAct", "LayerNormAct", "LayerNormAct2d")


def make(kind, side, act, c):
    """normlab's fused layer, timm's (the stand-in: the norm, then the activation), or normlab's plain norm."""
    if kind == "BatchNormAct2d":
        cls = {"normlab": normlab.nn.BatchNormAct2d, "timm": T.BatchNormAct2d}.get(side)
        return cls(c, act_layer=act) if cls else normlab.nn.BatchNorm2d(c)
    if kind == "GroupNormAct":
        cls = {"normlab": normlab.nn.GroupNormAct, "timm": T.GroupNormAct}.get(side)
        g = math.gcd(32, c)  # timm's default 32 groups where C allows it, else the largest divisor of both
        return cls(c, g, act_layer=act) if cls else normlab.nn.GroupNorm(g, c)
    if kind == "LayerNormAct":  # over the last dim of the (N, C, H, W) tensor
        cls = {"normlab": normlab.nn.LayerNormAct, "timm": T.LayerNormAct}.get(side)
        return cls(c, act_layer=act) if cls else normlab.nn.LayerNorm(c)
    cls = {"normlab": normlab.nn.LayerNormAct2d, "timm": T.LayerNormAct2d}.get(side)
    return cls(c, act_layer=act) if cls else normlab.nn.LayerNorm2d(c)


def width(kind, shape):
    return shape[-1] if kind == "LayerNormAct" else shape[1]


CLOCK = time.perf_counter


def timed(f):
    t = CLOCK()
    f()
    return CLOCK() - t


def cell(kind, act, shape, dt, fmt, threads, mode, reps):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    x = torch.randn(shape).to(dt).contiguous(memory_format=fmt)
    dy = torch.randn(shape).to(dt).contiguous(memory_format=fmt)
    mods = {s: make(kind, s, act, width(kind, shape)).to(dt if kind != "BatchNormAct2d" or dt == torch.float32
                                                          else torch.float32)
            for s in ("normlab", "timm", "plain")}
    if mode == "fwd":
        def call(m):
            with torch.no_grad():
                m(x)
    else:
        xg = x.clone().requires_grad_()

        def call(m):
            m(xg).backward(dy)
    for _ in range(2):
        for m in mods.values():
            call(m)
    ts = {s: [] for s in mods}
    for _ in range(reps):
        for s, m in mods.items():
            ts[s].append(timed(lambda: call(m)))
    return {s: statistics.median(v) * 1e3 for s, v in ts.items()}


def peak_child(kind, side, act, shape, dt, fmt):
    """One fwd+bwd call in this (fresh) process: the peak resident memory above what it held before, MB."""
    torch.set_num_threads(1)
    m = make(kind, side, act, width(kind, shape))
    small = torch.randn(2, shape[1], 4, 4).requires_grad_()
    m(small).backward(torch.randn_like(small))
    x = torch.empty(shape, dtype=dt).normal_().contiguous(memory_format=fmt).requires_grad_()
    dy = torch.empty(shape, dtype=dt).normal_().contiguous(memory_format=fmt)
    m = m.to(dt if kind != "BatchNormAct2d" or dt == torch.float32 else torch.float32)

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    before = rss()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    m(x).backward(dy)
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))
    print((hwm - before) / 2**20)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--memory", action="store_true")
    ap.add_argument("--child", nargs=6)
    ap.add_argument("--kinds", default="BatchNormAct2d,GroupNormAct")
    ap.add_argument("--acts", default="relu,silu")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--layouts", default="nchw,cl")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--modes", default="fwd,fwd+bwd")
    ap.add_argument("--shapes", default=None, help="e.g. 16x64x56x56,32x256x14x14")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time the calling thread's CPU time (time.thread_time) instead of wall time: one "
                         "thread only (the work runs on the calling thread), steadier on a shared machine")
    a = ap.parse_args()
    if a.cpu_time:
        global CLOCK
        CLOCK = time.thread_time
        if a.threads != "1":
            ap.error(f"--cpu-time times the calling thread only: it needs --threads 1, got --threads {a.threads}")
    dts = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    fmts = {"nchw": torch.contiguous_format, "cl": torch.channels_last}
    kinds, acts = a.kinds.split(","), a.acts.split(",")
    shapes = [tuple(int(v) for v in t.split("x")) for t in a.shapes.split(",")] if a.shapes else SHAPES
    sel_dts, sel_fmts = a.dtypes.split(","), a.layouts.split(",")
    sel_threads, modes = [int(t) for t in a.threads.split(",")], a.modes.split(",")
    if a.child:
        kind, side, act, shape, dt, fmt = a.child
        peak_child(kind, side, act, tuple(int(v) for v in shape.split("x")), dts[dt], fmts[fmt])
        return
    if a.memory:
        print("| layer | act | shape | dtype | layout | normlab peak MB | timm peak MB |")
        print("|---|---|---|---|---|---|---|")
        for kind in kinds:
            for act in acts:
                for shape in shapes:
                    for dt in sel_dts:
                        for fmt in sel_fmts:
                            got = {}
                            for side in ("normlab", "timm"):
                                out = subprocess.run([sys.executable, __file__, "--child", kind, side, act,
                                                      "x".join(map(str, shape)), dt, fmt], capture_output=True,
                                                     text=True)
                                got[side] = float(out.stdout.strip().splitlines()[-1])
                            print(f"| {kind} | {act} | {shape} | {dt} | {fmt} | {got['normlab']:.1f} | "
                                  f"{got['timm']:.1f} |", flush=True)
        return
    print("| layer | act | shape | dtype | layout | threads | mode | normlab ms | timm ms | plain ms | speedup | vs plain |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for kind in kinds:
        for act in acts:
            for shape in shapes:
                for dt in sel_dts:
                    for fmt in sel_fmts:
                        for threads in sel_threads:
                            for mode in modes:
                                r = cell(kind, act, shape, dts[dt], fmts[fmt], threads, mode, a.reps)
                                print(f"| {kind} | {act} | {shape} | {dt} | {fmt} | {threads} | {mode} | "
                                      f"{r['normlab']:.2f} | {r['timm']:.2f} | {r['plain']:.2f} | "
                                      f"{r['timm'] / r['normlab']:.2f}x | {r['normlab'] / r['plain']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
