"""One-thread timings of the large-shape rows of docs/performance.md, for a side-by-side run of two
normlab versions in two virtual environments (the C++ kernels and the last Numba commit, 7e40762):

    venv-a/bin/python scripts/bench-large-rows.py > a.txt && venv-b/bin/python scripts/bench-large-rows.py > b.txt

Prints 'name<TAB>ms' lines: the minimum over repeats of one call's thread CPU time, after warm-up.
scripts/compare-large-rows.py runs it alternately in two environments and makes the table."""
import time

import torch

import normlab
import normlab.functional as F
torch.set_num_threads(1)
torch.manual_seed(0)

def t(fn, reps=9, inner=3):
    for _ in range(2): fn()
    best = 1e9
    for _ in range(reps):
        c = time.thread_time()
        for _ in range(inner): fn()
        best = min(best, (time.thread_time() - c) / inner)
    return best * 1e3

rows = []
def case(name, make):
    x, fwd = make()
    rows.append((name + " fwd", t(lambda: fwd(x))))
    xg = x.detach().clone().requires_grad_()
    y = fwd(xg); dy = torch.randn_like(y)
    rows.append((name + " fwd+bwd", t(lambda: torch.autograd.grad(fwd(xg), xg, dy))))

with normlab.use_backend("cpu"):
    for dt in (torch.float32, torch.bfloat16):
        s = str(dt).split(".")[1]
        w = torch.ones(1024, dtype=dt); b = torch.zeros(1024, dtype=dt)
        case(f"layer_norm 32768x1024 {s}", lambda: (torch.randn(32768, 1024).to(dt), lambda x: F.layer_norm(x, (1024,), w, b)))
        case(f"rms_norm 32768x1024 {s}", lambda: (torch.randn(32768, 1024).to(dt), lambda x: F.rms_norm(x, (1024,), w)))
        for fmt, nm in ((torch.contiguous_format, "nchw"), (torch.channels_last, "nhwc")):
            c = 64
            wc = torch.ones(c, dtype=dt); bc = torch.zeros(c, dtype=dt)
            case(f"batch_norm train 32x64x32x32 {nm} {s}", lambda: (torch.randn(32, 64, 32, 32).to(dt).contiguous(memory_format=fmt),
                 lambda x: F.batch_norm(x, None, None, wc, bc, training=True)))
            wg = torch.ones(256, dtype=dt); bg = torch.zeros(256, dtype=dt)
            case(f"group_norm 256x256x8x8 {nm} {s}", lambda: (torch.randn(256, 256, 8, 8).to(dt).contiguous(memory_format=fmt),
                 lambda x: F.group_norm(x, 32, wg, bg)))
            case(f"layer_norm2d 16x64x128x128 {nm} {s}", lambda: (torch.randn(16, 64, 128, 128).to(dt).contiguous(memory_format=fmt),
                 lambda x: F.layer_norm2d(x, wc, bc)))
        wg2 = torch.ones(1024, dtype=dt); bg2 = torch.zeros(1024, dtype=dt)
        case(f"group_norm 2-D 4096x1024 {s}", lambda: (torch.randn(4096, 1024).to(dt), lambda x: F.group_norm(x, 32, wg2, bg2)))
for name, ms in rows:
    print(f"{name}\t{ms:.3f}")
