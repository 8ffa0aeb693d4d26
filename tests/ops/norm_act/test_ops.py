"""The registered norm+act ops (torch.ops.normlab.*_act_*): torch.library.opcheck (schema, autograd
registration, FakeTensor against the CPU kernels, AOT dispatch) on both memory formats, and the Meta
kernels' outputs -- shapes, dtypes, strides, None where the CPU kernel returns none -- against the
CPU kernels' on a grid of layouts and dtypes (the CPU kernels are the oracle)."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import normlab

pytestmark = pytest.mark.skipif("cpu" not in normlab.available_backends(), reason="no C++ extension")

ops = torch.ops.normlab
CL, CL3 = torch.channels_last, torch.channels_last_3d
SILU = 3


def _t(shape, dtype=torch.float32, seed=0, fmt=None, positive=False):
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(shape, generator=g) + 0.5 if positive else torch.randn(shape, generator=g)
    t = t.to(dtype)
    return t.contiguous(memory_format=fmt) if fmt is not None else t


def _cases():
    """(name, op, args) of every op: forward and backward, on layouts and dtypes that reach each
    output rule (suggested memory formats, S == 1, rows of a channels_last tensor, half precision
    beside float32 parameters, parameters absent)."""
    out = []
    for fmt, shape in ((None, (3, 4, 5, 6)), (CL, (3, 4, 5, 6)), (None, (6, 4)), (None, (2, 4, 7)),
                       (CL3, (2, 4, 3, 2, 2)), (CL, (3, 4, 1, 1))):
        for dt in (torch.float32, torch.bfloat16, torch.float64):
            x = _t(shape, dt, fmt=fmt)
            pd = torch.float64 if dt == torch.float64 else torch.float32
            w, b = _t(4, pd, 1, positive=True), _t(4, pd, 2)
            tag = f"{tuple(shape)} {fmt} {dt}"
            for training in (True, False):
                rm, rv = _t(4, pd, 3), _t(4, pd, 4, positive=True)
                args = (x, w, b, rm, rv, training, 0.1, 1e-5, SILU, 0.0)
                out.append((f"batch_norm_act_fwd {tag} {training}", ops.batch_norm_act_fwd, args))
                y, stats = ops.batch_norm_act_fwd(x, w, b, rm.clone(), rv.clone(), training, 0.1, 1e-5, SILU, 0.0)
                for p in ((w, b), (None, None)):
                    out.append((f"batch_norm_act_bwd {tag} {training} {p[0] is None}", ops.batch_norm_act_bwd,
                                (_t(shape, dt, 5), x, *p, stats, training, SILU, 0.0, True, True, True)))
                out.append((f"batch_norm_act_bwd {tag} {training} dw alone", ops.batch_norm_act_bwd,
                            (_t(shape, dt, 5), x, w, b, stats, training, SILU, 0.0, False, True, False)))
            gw, gb = w.to(dt if dt == torch.float64 else torch.float32), b.to(w.dtype)
            out.append((f"group_norm_act_fwd {tag}", ops.group_norm_act_fwd, (x, gw, gb, 2, 1e-5, SILU, 0.0)))
            _, mean, rstd = ops.group_norm_act_fwd(x, gw, gb, 2, 1e-5, SILU, 0.0)
            for need_dx in (True, False):
                out.append((f"group_norm_act_bwd {tag} {need_dx}", ops.group_norm_act_bwd,
                            (_t(shape, dt, 5), x, gw, gb, mean, rstd, 2, SILU, 0.0, need_dx)))
            # rows: a contiguous x's trailing values, or a 4-D channels_last x's channels
            n_cols = 4 if fmt == CL else (shape[-1] if fmt is None else None)
            if n_cols is not None:
                lw, lb = _t(n_cols, dt, 1, positive=True), _t(n_cols, dt, 2)
                for p in ((lw, lb), (lw, None), (None, None)):
                    args = (x, n_cols, *p, 1e-5, SILU, 0.0)
                    out.append((f"layer_norm_act_fwd {tag} {p[1] is None} {p[0] is None}", ops.layer_norm_act_fwd,
                                args))
                    _, mean, rstd = ops.layer_norm_act_fwd(*args)
                    out.append((f"layer_norm_act_bwd {tag} {p[1] is None} {p[0] is None}", ops.layer_norm_act_bwd,
                                (_t(shape, dt, 5), x, *p, mean, rstd, n_cols, SILU, 0.0, True)))
            if fmt is None:  # LayerNormAct2d's NCHW op: contiguous (N, C, *)
                for p in ((w.to(dt), b.to(dt)), (None, None)):
                    args = (x, *p, 1e-5, SILU, 0.0)
                    out.append((f"layer_norm_act2d_fwd {tag} {p[0] is None}", ops.layer_norm_act2d_fwd, args))
                    _, mean, rstd = ops.layer_norm_act2d_fwd(*args)
                    for need in (True, False):
                        out.append((f"layer_norm_act2d_bwd {tag} {p[0] is None} {need}", ops.layer_norm_act2d_bwd,
                                    (_t(shape, dt, 5), x, *p, mean, rstd, SILU, 0.0, need)))
    return out


CASES = _cases()


def _meta(t):
    return None if t is None else (tuple(t.shape), t.dtype, tuple(t.stride()))


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_fake_outputs_are_the_cpu_kernels(name):
    _, op, args = next(c for c in CASES if c[0] == name)
    real = op(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
    with FakeTensorMode() as mode:
        fake = op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
    assert [_meta(t) for t in fake] == [_meta(t) for t in real]


OPCHECK = ["batch_norm_act_fwd", "batch_norm_act_bwd", "group_norm_act_fwd", "group_norm_act_bwd",
           "layer_norm_act_fwd", "layer_norm_act_bwd", "layer_norm_act2d_fwd", "layer_norm_act2d_bwd"]


@pytest.mark.parametrize("fmt", [None, CL])
@pytest.mark.parametrize("op", OPCHECK)
def test_opcheck(op, fmt):
    if op.startswith("layer_norm_act2d") and fmt is not None:
        pytest.skip("layer_norm_act2d_* take a contiguous x (a channels_last one takes layer_norm_act_*)")
    picked = [c for c in CASES if c[0].startswith(op + " ") and f"(3, 4, 5, 6) {fmt} torch.float32" in c[0]]
    assert picked
    for _, f, args in picked:
        torch.library.opcheck(f, args)
