"""Random differential test: normlab.functional against torch.nn.functional.

Random calls over shapes with zero-size dims, non-contiguous, expanded and
channels_last inputs, four dtypes and odd eps. Where torch computes, normlab
computes the same (outputs, and running statistics where they are updated);
where torch raises, normlab raises. The oracle is torch itself.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

import normlab
import normlab.functional as NF

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
TOL = {torch.float64: 1e-9, torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float16: 4e-3}
EPS = [1e-5, 1e-12, 0.0, 1.0, 0.3]
N_CALLS = int(__import__("os").environ.get("NORMLAB_DIFF_CALLS", "400"))


def _shape(rng, rank):
    return [rng.choice([0, 1, 1, 2, 3, 4, 5]) if rng.random() < 0.15 else rng.choice([1, 2, 3, 4, 5, 6])
            for _ in range(rank)]


def _tensor(rng, shape, dtype, layout):
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    if layout == "transposed" and len(shape) >= 2:
        t = torch.randn(shape[:-2] + [shape[-1], shape[-2]], generator=g, dtype=torch.float64).transpose(-1, -2)
    elif layout == "strided":
        t = torch.randn(shape[:-1] + [2 * shape[-1]], generator=g, dtype=torch.float64)[..., ::2]
    elif layout == "expanded" and len(shape) >= 1:
        t = torch.randn([1] + shape[1:], generator=g, dtype=torch.float64).expand(shape)
    elif layout == "channels_last" and len(shape) == 4:
        t = torch.randn(shape, generator=g, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    else:
        t = torch.randn(shape, generator=g, dtype=torch.float64)
    return (t * rng.choice([1.0, 3.0]) + rng.choice([0.0, 2.0])).to(dtype)


def _param(rng, n, dtype, present=0.8):
    if rng.random() > present:
        return None
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    return torch.randn(n, generator=g, dtype=torch.float64).to(dtype)


def _case(rng):
    """One random call: ``(op, dtype, torch function, normlab function, args, buffer positions)``;
    ``args`` a list in the functions' order (tensors, shapes, flags), buffers updated in place."""
    op = rng.choice(["layer_norm", "rms_norm", "batch_norm", "group_norm", "instance_norm"])
    dtype = rng.choice(DTYPES)
    pdt = dtype if rng.random() < 0.8 or dtype in (torch.float32, torch.float64) else torch.float32
    rank = rng.choice([2, 3, 4, 5]) if op not in ("layer_norm", "rms_norm") else rng.choice([1, 2, 3, 4])
    shape = _shape(rng, rank)
    x = _tensor(rng, shape, dtype, rng.choice(["contiguous", "transposed", "strided", "expanded", "channels_last"]))
    eps = rng.choice(EPS)
    if op in ("layer_norm", "rms_norm"):
        k = rng.choice([1, 1, 2]) if rank >= 2 else 1
        ns = tuple(shape[-k:]) if rng.random() < 0.9 else tuple(shape[-k:][:-1] + [shape[-1] + 1])
        w = _param(rng, ns, pdt)
        if op == "layer_norm":
            return op, dtype, F.layer_norm, NF.layer_norm, [x, ns, w, _param(rng, ns, pdt), eps], ()
        return op, dtype, F.rms_norm, NF.rms_norm, [x, ns, w, None if rng.random() < 0.3 else eps], ()
    c = shape[1]
    w, b = _param(rng, c, pdt), _param(rng, c, pdt)
    if op == "group_norm":
        g = rng.choice([1, 2, 3]) if c else 1
        return op, dtype, F.group_norm, NF.group_norm, [x, g, w, b, eps], ()
    stats = rng.random() < 0.6
    rm = _param(rng, c, pdt, 1.0) if stats else None
    rv = (_param(rng, c, pdt, 1.0).abs() + 0.5).to(pdt) if stats else None
    flag = rng.random() < (0.6 if op == "batch_norm" else 0.7)
    fns = (F.batch_norm, NF.batch_norm) if op == "batch_norm" else (F.instance_norm, NF.instance_norm)
    return op, dtype, fns[0], fns[1], [x, rm, rv, w, b, flag, rng.choice([0.1, 0.5]), eps], (1, 2) if stats else ()


def _run(fn):
    try:
        return fn(), None
    except Exception as e:  # noqa: BLE001 - whether it raises is what is compared
        return None, e


def _copy(args, dtype=None):
    """Fresh copies of the tensors in ``args`` (in ``dtype`` if given), the rest as they are."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            a = a.to(dtype) if dtype is not None else a.clone()
        out.append(a)
    return out


def _close(a, b, tol):
    if a.shape != b.shape:
        return False
    a, b = a.double(), b.double()
    return bool(torch.allclose(a, b, rtol=tol, atol=tol * max(1.0, float(b.abs().nan_to_num(0, 0, 0).max()) if b.numel() else 1.0), equal_nan=True))


# torch's own internal errors, where normlab returns torch's result for the valid case (an
# empty output for 0 channels) or computes what torch's fused path refuses (instance_norm of a
# bfloat16/float16 input with float32 parameters, which torch's layer_norm and batch_norm take)
TORCH_INTERNAL = ("select(): index 0 out of range", "mixed dtype (CPU)")


@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_random_calls_agree_with_torch(backend):
    rng = random.Random(2026)
    mismatches, counts = [], {"equal": 0, "both raise": 0, "torch internal": 0, "exact where torch is not": 0}
    for i in range(N_CALLS):
        name, dtype, torch_fn, our_fn, args, buf_at = _case(rng)
        t_args, n_args = _copy(args), _copy(args)
        want, t_err = _run(lambda: torch_fn(*t_args))
        with normlab.use_backend("auto" if backend == "cpu" else "ref"):
            got, n_err = _run(lambda: our_fn(*n_args))
        if t_err is not None:
            if n_err is not None:
                counts["both raise"] += 1
            elif any(m in str(t_err) for m in TORCH_INTERNAL):
                counts["torch internal"] += 1
            else:
                mismatches.append((i, name, "torch raises, normlab computes", repr(t_err)[:120]))
            continue
        if n_err is not None:
            mismatches.append((i, name, "normlab raises where torch computes", repr(n_err)[:200]))
            continue
        outs = [(got, want)] + [(n_args[k], t_args[k]) for k in buf_at]
        if got.dtype == want.dtype and all(_close(a, b, TOL[dtype]) for a, b in outs):
            counts["equal"] += 1
            continue
        # torch's float32 arithmetic of a low-precision input can be the less accurate one
        # (a set of one value, eps 1e-12): accept normlab where it matches float64
        e_args = _copy(args, torch.float64)
        exact = torch_fn(*e_args)
        outs = [(got, exact.to(dtype))] + [(n_args[k], e_args[k].to(args[k].dtype)) for k in buf_at]
        if got.dtype == want.dtype and all(_close(a, b, TOL[dtype]) for a, b in outs):
            counts["exact where torch is not"] += 1
        else:
            mismatches.append((i, name, "values differ", dtype, tuple(want.shape)))
    assert not mismatches, "\n".join(map(str, mismatches[:20])) + f"\n({len(mismatches)} of {N_CALLS}; {counts})"
    assert counts["equal"] > N_CALLS // 2 and counts["both raise"] > 20  # the cases reach both outcomes
