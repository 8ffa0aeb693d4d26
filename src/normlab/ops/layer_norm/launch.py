"""The launchers of the LayerNorm / RMSNorm kernels: tensors in, the kernel run, tensors out.

:func:`_forward` / :func:`_backward` allocate the outputs, pass bfloat16/float16
tensors as their bits (``ops/_bf16.py``) and every tensor by address
(``ops/_ptr.py``), and run the kernel (``kernels.py``, imported on first use)
in the version that fits the size (``ops/_launch.use_parallel``). ``op.py``
builds the custom ops, the eager and the transform Functions on them.
"""

import functools

import numpy as np
import torch

from .. import _launch
from .._launch import PROTO as _PROTO
from .._launch import call as _call
from .._launch import kernels_loader
from .._launch import param_ptr as _param_ptr

# --------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------

_k = kernels_loader(__package__)  # kernels.py, imported (numba and all) on first use

_ACC = {torch.float64: torch.float64}  # accumulation dtype; float32 for the rest


def _forward(x, res, w, b, eps, center, offset=0.0, cast_x_hat=False):
    """Run ``norm_fwd`` on 2-D ``x`` (and ``res``); returns ``(y, h, mean, rstd)``.

    ``h`` is None without ``res``; ``mean`` is empty for RMSNorm (``center=False``).
    RMSNorm's variants: the kernel gets ``w + offset`` (added here, in the accumulation
    dtype) and rounds ``x_hat`` before the weight when ``cast_x_hat``.
    ``mean`` and ``rstd`` are numpy arrays in the accumulation dtype (the eager
    path keeps them as they are; the custom ops wrap them with ``torch.from_numpy``).

    ``w``/``b`` may also be (G, n_cols) (``torch.func.vmap`` over stacked weights, see
    ``op._vmap``): G weights, each for ``n_rows / G`` consecutive rows, G dividing n_rows.
    """
    n_rows, n_cols = x.shape
    if not x.is_contiguous():
        x = x.contiguous()
    y = _launch.empty_like(x)  # (n_rows, n_cols)
    h = None
    if res is not None:
        h = _launch.empty_like(x)  # (n_rows, n_cols)
        if not res.is_contiguous():
            res = res.contiguous()
    numel = n_rows * n_cols
    proto, acc_proto = _PROTO[x.dtype]
    if numel == 0:
        if h is not None:
            h.copy_(x + res)
        acc = acc_proto.dtype
        return y, h, np.full(n_rows if center else 0, np.nan, acc), np.full(n_rows, np.nan, acc)
    acc = _ACC.get(x.dtype, torch.float32)
    if offset != 0.0 and w is not None:
        w = w.detach().to(acc) + offset  # (n_cols,) the weight as applied
    pw, keep_w = _param_ptr(w, acc)
    pb, keep_b = _param_ptr(b, acc)
    k = _k(numel)
    px = x.data_ptr()
    mean, rstd = _call(
        k.norm_fwd_at, x.dtype, proto, acc_proto, px,
        res.data_ptr() if res is not None else px, h.data_ptr() if h is not None else px,
        pw, pb, y.data_ptr(), n_rows, n_cols, float(eps), res is not None, bool(center), bool(cast_x_hat),
        _rows_per_chunk(n_rows, n_cols),  # rows per task (no effect on results)
        _n_weights(w, b),
    )
    return y, h, mean, rstd


_rows_per_chunk = functools.lru_cache(maxsize=1024)(_launch.rows_per_chunk)


def _n_weights(w, b) -> int:
    """How many weight rows the kernel gets: G for (G, n_cols) weights, else 1."""
    p = w if w is not None else b
    return p.shape[0] if p is not None and p.dim() == 2 else 1


# The backward's chunks: at least _launch.rows_per_chunk rows, enlarged up to this
# many while at least BWD_MIN_CHUNKS chunks remain. Each chunk writes one row of
# dw/db partials, merged after: 8192x4096 float32 went from 512 partial rows (16 MB
# written and read again) to 32, backward ~51 -> ~45 ms.
BWD_MAX_ROWS = 256
BWD_MIN_CHUNKS = 32


@functools.lru_cache(maxsize=1024)
def _bwd_rows(n_rows: int, n_cols: int) -> int:
    """Rows per chunk of ``norm_bwd`` (from the shape only: the bits never depend on threads)."""
    rows = _launch.rows_per_chunk(n_rows, n_cols)
    return max(rows, min(BWD_MAX_ROWS, n_rows // BWD_MIN_CHUNKS))


def _backward(dy, x, w, mean, rstd, dh, center, need_wb, offset=0.0, cast_x_hat=False):
    """Run ``norm_bwd``; returns ``(dx, dw, db)`` with dw/db in the accumulation dtype.

    ``dx`` includes ``dh`` when given (the fused add). ``dw``/``db`` are empty
    (0,) tensors unless ``need_wb``; (G, n_cols) for a (G, n_cols) ``w`` (see
    :func:`_forward`). ``mean``/``rstd``: the forward's, as numpy arrays or tensors.
    """
    n_rows, n_cols = x.shape
    acc = _ACC.get(x.dtype, torch.float32)
    if not x.is_contiguous():
        x = x.contiguous()
    if dy.dtype != x.dtype:
        dy = dy.to(x.dtype)
    if not dy.is_contiguous():
        dy = dy.contiguous()
    dx = _launch.empty_like(x)  # (n_rows, n_cols)
    numel = n_rows * n_cols
    if numel == 0:
        if dh is not None:
            dx.copy_(dh)
        shape = (n_cols,) if w is None or w.dim() == 1 else tuple(w.shape)
        n = shape if need_wb else (0,)
        return dx, x.new_zeros(n, dtype=acc), x.new_zeros(n, dtype=acc)
    if dh is not None and (dh.dtype != x.dtype or not dh.is_contiguous()):
        dh = dh.to(x.dtype).contiguous()
    if isinstance(mean, torch.Tensor):  # the custom ops' saved statistics
        mean, rstd = mean.contiguous().numpy(), rstd.contiguous().numpy()
    if offset != 0.0 and w is not None:
        w = w.detach().to(acc) + offset  # (n_cols,) the weight as applied
    pw, keep_w = _param_ptr(w, acc)
    k = _k(numel)
    proto, acc_proto = _PROTO[x.dtype]
    pdy = dy.data_ptr()
    n_w = _n_weights(w, None)
    rows = _bwd_rows(n_rows // n_w, n_cols)  # chunks within each weight's rows
    dw, db = _call(
        k.norm_bwd_at, x.dtype, proto, acc_proto, pdy, x.data_ptr(), pw, mean, rstd,
        dh.data_ptr() if dh is not None else pdy, dx.data_ptr(), n_rows, n_cols,
        rows, dh is not None, bool(center), bool(cast_x_hat), bool(need_wb), n_w,
    )
    dw, db = torch.from_numpy(dw), torch.from_numpy(db)  # (n_w, n_cols), or (0, n_cols)
    if n_w == 1 and (w is None or w.dim() == 1):
        dw, db = dw.view(-1), db.view(-1)  # (n_cols,), or (0,)
    return dx, dw, db
