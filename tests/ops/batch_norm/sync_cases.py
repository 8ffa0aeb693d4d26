"""The cases the spawned groups run, built here from seeds; the oracle and the ranks read the same tensors.

Uneven batches cover the situations where torch's SyncBatchNorm had its bugs:
the running variance (pytorch #22192), the input gradient (#36382), a rank
with an empty batch (#74944) and uneven batches on gloo (#62967).
"""

from __future__ import annotations

import torch
from torch import nn


def make_case(sizes, tail=(), c=3, dtype=torch.float64, layout="contiguous", backend="auto", offset=0.0, seed=0,
              **kwargs):
    """Per-rank batch sizes, the inputs of two training steps, upstream gradients, parameters, module kwargs."""
    g = torch.Generator().manual_seed(seed)
    n = sum(sizes)

    def randn(*shape, scale=1.0, shift=0.0):
        return (torch.randn(shape, generator=g, dtype=torch.float64) * scale + shift).to(dtype)

    return dict(
        sizes=sizes, sizes2=sizes[1:] + sizes[:1],  # step 2: the sizes rotate
        c=c, dtype=dtype, layout=layout, backend=backend, kwargs=kwargs,
        x=randn(n, c, *tail, scale=2.0, shift=offset), dy=randn(n, c, *tail),
        x2=randn(n, c, *tail, scale=3.0, shift=-1.0), x_eval=randn(2, c, *tail),
        w=1 + 0.5 * torch.randn(c, generator=g, dtype=torch.float64),
        b=torch.randn(c, generator=g, dtype=torch.float64),
    )


def slice_of(t, sizes, rank):
    """Rank ``rank``'s part of a batch split into ``sizes``."""
    start = sum(sizes[:rank])
    return t[start:start + sizes[rank]]


def in_layout(t, layout):
    if layout == "channels_last":
        return t.contiguous(memory_format=torch.channels_last if t.dim() == 4 else torch.channels_last_3d)
    return t


def mlp(norm):
    """Linear -> norm -> Tanh -> Linear in float64, the same weights for any ``norm`` class."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 8), norm(8, momentum=None), nn.Tanh(), nn.Linear(8, 3)).double()


CASES_2 = {
    "NC uneven 5+3": make_case([5, 3]),
    "NC empty rank 0 (#74944)": make_case([0, 6], seed=1),
    "NC one sample per rank": make_case([1, 1], seed=2),
    "NCL uneven, momentum=None": make_case([2, 5], tail=(4,), momentum=None, seed=3),
    "NCHW uneven 3+1": make_case([3, 1], tail=(2, 3), seed=4),
    "NCHW channels_last, affine=False": make_case([2, 3], tail=(3, 2), layout="channels_last", affine=False,
                                                  seed=5),
    "NCDHW uneven, bias=False": make_case([1, 2], tail=(2, 2, 3), bias=False, seed=6),
    "NCDHW channels_last_3d": make_case([2, 1], tail=(2, 1, 3), layout="channels_last", seed=7),
    "NCL no running stats": make_case([2, 3], tail=(3,), track_running_stats=False, seed=8),
    "NCL reference backend (the GPU path)": make_case([3, 2], tail=(2,), backend="ref", seed=9),
    "float32 NCHW channels_last": make_case([4, 2], tail=(3, 3), dtype=torch.float32, layout="channels_last",
                                            seed=10),
    "float32 NC empty rank 1": make_case([7, 0], dtype=torch.float32, seed=11),
    "float32 mean 1e3, std 2 (no E[x^2]-E[x]^2)": make_case([6, 9], tail=(5,), dtype=torch.float32, offset=1e3,
                                                            momentum=0.5, seed=12),
    "float32 NCL reference backend": make_case([1, 4], tail=(3,), dtype=torch.float32, backend="ref", seed=13),
    "bfloat16 NCHW (float32 statistics)": make_case([3, 2], tail=(2, 2), dtype=torch.bfloat16, seed=14),
}

CASES_3 = {
    "NC uneven 2+0+5": make_case([2, 0, 5], seed=20),
    "NCHW 1+3+2 (#22192, #36382)": make_case([1, 3, 2], tail=(2, 2), momentum=0.3, seed=21),
    "NCL two empty ranks": make_case([0, 4, 0], tail=(2,), seed=22),
    "float32 NCHW channels_last 3+2+1": make_case([3, 2, 1], tail=(2, 3), dtype=torch.float32,
                                                  layout="channels_last", seed=23),
}

SUBSET_CASE = make_case([3, 4], tail=(2,), seed=24)  # ranks 0 and 2 of a world of 3
SUBSET_MEMBERS = [0, 2]

_g = torch.Generator().manual_seed(30)
COMPILE_CASE = ([3, 6], torch.randn(9, 2, generator=_g, dtype=torch.float64),
                torch.randn(9, 3, generator=_g, dtype=torch.float64))

FAULT_TIMEOUT_S = 3  # the timeout of the groups the fault checks run in

# the example's distributed runs (normlab experiment ddp), short: 2 ranks x 4 samples, 12 steps
DDP_OPTIONS = dict(nproc=2, batch=4, steps=12, lr=0.1, seed=123, timeout=60.0, quick=True, fail_rank=None)

# per-rank samples for pooling recalibration statistics across ranks (rank 1 saw none)
MOMENT_CHUNKS = [torch.randn(5, 4, generator=_g, dtype=torch.float64) * 3 + 100,
                 torch.empty(0, 4, dtype=torch.float64),
                 torch.randn(9, 4, generator=_g, dtype=torch.float64) - 7]
