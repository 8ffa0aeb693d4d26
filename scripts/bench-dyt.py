"""DyT's speed: normlab DyT beside normlab's LayerNorm, the copy limit, and torch's unfused DyT.

For each size (rows x hidden), dtype, thread count: forward (no grad) and forward+backward,
the least of ``--repeats`` rounds in which the contenders run interleaved (a batch of calls
each per round, so a noisy neighbour hits them alike): CPU time of the calling thread with one
thread (time spent descheduled on a busy machine is not counted), wall time with more.

- ``DyT``: ``normlab.nn.DyT``; ``LN``: ``normlab.nn.LayerNorm``; ``torch``: the paper's module
  in torch ops, ``tanh(alpha * x) * weight + bias`` (``--torch``);
- ``copy``: the copy limit, one read and one write per value, into a tensor allocated before
  (``y.copy_(x)``); for forward+backward that copy plus ``torch.add(dy, x, out=...)`` (two
  reads and a write per value: the least the backward's dx can move);
- ``alloc copy``: ``torch.empty_like(x).copy_(x)``, the copy with its output allocated per
  call, as DyT's is (at tens of MB the fresh pages' first touch costs more than the copy);
- ``hp copy``: the same with the fresh output advised onto transparent huge pages first, as
  normlab's kernels advise theirs (``normlab.ops.extension.empty_like``): the copy limit of an
  output allocated per call the way DyT's is (torch's own 4 kB first touches are several times
  slower at tens of MB);
- ratios: ``DyT/LN`` (< 1: DyT faster), ``copy/DyT`` (the fraction of the copy limit into
  memory allocated before; 1 is the limit) and ``hp/DyT`` (of the limit with a fresh output).

    python scripts/bench-dyt.py                      # the sweep, 1 and 2 threads
    python scripts/bench-dyt.py --sizes 512x768 --threads 1 --torch
"""
import argparse
import time

import torch

import normlab
from normlab.ops.extension import empty_like as hp_empty_like  # (advised onto huge pages from 4 MiB)

DEFAULT_SIZES = [(r, h) for r in (1, 8, 64, 512, 4096) for h in (64, 768, 4096, 16384)] + [(8192, 4096)]


class TorchDyT(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.alpha = torch.nn.Parameter(torch.full((1,), 0.5))
        self.weight = torch.nn.Parameter(torch.ones(d))
        self.bias = torch.nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return torch.tanh(self.alpha * x) * self.weight + self.bias


def interleaved(fns: dict, repeats: int, inner: int) -> dict:
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    for f in fns.values():  # warm-up
        f()
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t = clock()
            for _ in range(inner):
                f()
            times[k].append((clock() - t) / inner)
    return {k: min(v) * 1e6 for k, v in times.items()}


def case(rows, d, dt, repeats, with_torch):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, d, generator=g).to(dt)
    dy = torch.randn(rows, d, generator=g).to(dt)
    mods = {"DyT": normlab.nn.DyT(d).to(dt), "LN": normlab.nn.LayerNorm(d).to(dt)}
    if with_torch:
        mods["torch"] = TorchDyT(d).to(dt)
    inner = max(1, int(2e6 / (rows * d)))
    out = torch.empty_like(x)
    with torch.no_grad():
        fwd = {k: (lambda m=m: m(x)) for k, m in mods.items()}
        fwd["copy"] = lambda: out.copy_(x)
        fwd["alloc copy"] = lambda: torch.empty_like(x).copy_(x)
        fwd["hp copy"] = lambda: hp_empty_like(x).copy_(x)
        f = interleaved(fwd, repeats, inner)
    xg = x.clone().requires_grad_()

    def step(m):
        xg.grad = None
        m(xg).backward(dy)

    out2 = torch.empty_like(x)

    def copy_limit():
        out.copy_(x)
        torch.add(dy, x, out=out2)

    def alloc_copy_limit():
        torch.empty_like(x).copy_(x)
        torch.add(dy, x)

    def hp_copy_limit():
        hp_empty_like(x).copy_(x)
        torch.add(dy, x, out=hp_empty_like(x))

    both = {k: (lambda m=m: step(m)) for k, m in mods.items()}
    both["copy"] = copy_limit
    both["alloc copy"] = alloc_copy_limit
    both["hp copy"] = hp_copy_limit
    b = interleaved(both, repeats, max(1, inner // 3))
    return f, b


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default=None, help="comma-separated ROWSxHIDDEN (default: the sweep)")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--torch", action="store_true", help="also time torch's unfused DyT")
    a = p.parse_args()
    sizes = DEFAULT_SIZES if a.sizes is None else [tuple(int(v) for v in s.split("x")) for s in a.sizes.split(",")]
    print("| threads | size | dtype | pass | DyT us | LN us | copy us | alloc copy us | hp copy us | DyT/LN | copy/DyT "
          "| hp/DyT |" + (" torch us |" if a.torch else ""))
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if a.torch else ""))
    for threads in (int(t) for t in a.threads.split(",")):
        torch.set_num_threads(threads)
        for rows, d in sizes:
            for dt in (getattr(torch, n) for n in a.dtypes.split(",")):
                f, b = case(rows, d, dt, a.repeats, a.torch)
                for name, r in (("fwd", f), ("fwd+bwd", b)):
                    extra = f" {r['torch']:.1f} |" if a.torch else ""
                    print(f"| {threads} | {rows}x{d} | {str(dt)[6:]} | {name} | {r['DyT']:.1f} | {r['LN']:.1f} | "
                          f"{r['copy']:.1f} | {r['alloc copy']:.1f} | {r['hp copy']:.1f} | {r['DyT'] / r['LN']:.2f} | "
                          f"{r['copy'] / r['DyT']:.2f} | {r['hp copy'] / r['DyT']:.2f} |{extra}",
                          flush=True)


if __name__ == "__main__":
    main()
