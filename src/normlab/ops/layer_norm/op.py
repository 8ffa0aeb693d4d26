"""LayerNorm / RMSNorm and their fused residual adds: the family's entries, one function per op,
each running the path ``normlab._backend.route`` decided.

The ops they call (registered in ``csrc/layer_norm.cpp``):
``layer_norm_fwd``, ``rms_norm_fwd``, ``add_layer_norm_fwd``, ``add_rms_norm_fwd`` (forward with
the (n_rows,) statistics, differentiable; double backward through the reference formula in
ATen), ``layer_norm_bwd``, ``rms_norm_bwd`` (backward) and ``row_norm_infer`` (the output alone).

The paths:

- ``REF``: the reference math, ``reference.ref_layer_norm`` and its siblings;
- ``EAGER``: :func:`_forward`, ``normlab._C.row_norm``: one C++ call that records autograd through
  the forward op when an input requires grad, and otherwise runs ``row_norm_infer``, which
  allocates only the output;
- ``COMPILE``: the forward ops through ``torch.ops.normlab`` (traced as single nodes);
- ``TRANSFORM``, torch.func transforms and forward-mode AD (a C++ ``autograd::Function`` refuses them):
  ``RowNormTransform``, a Python Function with the forward-mode rule and the vmap rule (a batch
  of row sets is one set of more rows; batched weights stay *grouped* weights), whose forward
  and backward call the same C++ ops.
"""

from __future__ import annotations

import torch

from ..._backend import COMPILE, REF, TRANSFORM
from .. import _register, _transforms, extension
from ..layouts import output_memory_format
from ..numerics import to_acc
from .reference import (
    layer_norm_backward_ref,
    layer_norm_stats,
    norm_jvp,
    ref_add_layer_norm,
    ref_add_rms_norm,
    ref_layer_norm,
    ref_rms_norm,
    rms_norm_backward_ref,
    rms_norm_stats,
)

_C = extension.load()
# (x, normalized_shape, residual, w, b, eps, center, offset, cast_x_hat, stats) -> (y, h, mean, rstd)
_forward = _C.row_norm if _C is not None else None
_ops = torch.ops.normlab


# --------------------------------------------------------------------------
# Under torch.func transforms and forward-mode AD (ops/_transforms.py): 2-D x,
# (y, mean, rstd) with (n_rows,) statistics (mean empty for RMSNorm)
# --------------------------------------------------------------------------


def _grouped(t, g: int):
    """2-D rows as (g, rows / g, n_cols): the rows of each of g grouped weights (see ``_vmap``)."""
    return t.reshape(g, -1, t.shape[-1])


def _transform_forward(x, w, b, eps, center, offset, cast_x_hat):
    y, _, mean, rstd = _forward(x, (x.shape[1],), None, w, b, eps, center, offset, cast_x_hat, True)
    return y, (mean if center else rstd.new_empty((0,))), rstd


def _transform_setup(ctx, inputs, output):
    x, w, b, eps, center, offset, cast_x_hat = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, w, mean, rstd)
    ctx.save_for_forward(x, w, mean, rstd)
    ctx.eps, ctx.center, ctx.offset, ctx.cast_x_hat = eps, center, offset, cast_x_hat
    ctx.b_dtype = b.dtype if b is not None else None
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(mean, rstd)


def _transform_backward(ctx, dy, _dmean, _drstd):
    x, w, mean, rstd = ctx.saved_tensors
    need = ctx.needs_input_grad
    need_dw = need[1] and w is not None
    need_db = need[2] and ctx.center and ctx.b_dtype is not None
    if dy is None:
        return None, None, None, None, None, None, None
    if _transforms.differentiable_backward():  # the differentiable reference backward
        shape = x.shape
        if w is not None and w.dim() == 2:  # grouped weights: rows as (G, rows per weight, n_cols)
            x, dy, w = _grouped(x, w.shape[0]), _grouped(dy, w.shape[0]), w.unsqueeze(1)
        xa = to_acc(x)
        if ctx.center:
            m, r = layer_norm_stats(xa, ctx.eps)
            dx, dw, db = layer_norm_backward_ref(dy, x, w, m, r, True, need_dw, need_db)
        else:
            r = rms_norm_stats(xa, ctx.eps)
            dx, dw = rms_norm_backward_ref(dy, x, w, r, True, need_dw, ctx.offset, ctx.cast_x_hat)
            db = None
        dx = dx.reshape(shape)
        if w is not None and w.dim() == 3:
            w = w.squeeze(1)
    elif ctx.center:
        dx, dw, db = _ops.layer_norm_bwd(dy, None, x, w, mean, rstd, (x.shape[1],), need_dw or need_db,
                                            ctx.b_dtype)
    else:
        dx, dw = _ops.rms_norm_bwd(dy, None, x, w, rstd, (x.shape[1],), ctx.offset, ctx.cast_x_hat, need_dw)
        db = None
    dw = dw.to(w.dtype) if need_dw else None
    db = db.to(ctx.b_dtype) if need_db else None
    return dx, dw, db, None, None, None, None


def _jvp(ctx, xt, wt, bt, _eps_t, _center_t, _offset_t, _cast_t):
    x, w, mean, rstd = ctx.saved_tensors
    m = mean.unsqueeze(1) if ctx.center else None
    rs = rstd.unsqueeze(1)
    p = next((t for t in (w, wt, bt) if t is not None), None)
    if p is not None and p.dim() == 2:  # grouped weights (vmap): rows as (G, rows per weight, n_cols)
        g, shape = p.shape[0], x.shape
        col = lambda t: None if t is None else t.reshape(g, -1, 1)  # noqa: E731
        row = lambda t: None if t is None else t.unsqueeze(1)  # noqa: E731
        yt = norm_jvp(_grouped(x, g), row(w), col(m), col(rs), None if xt is None else _grouped(xt, g),
                      row(wt), row(bt), ctx.center, ctx.offset, ctx.cast_x_hat)
        return (None if yt is None else yt.reshape(shape)), None, None
    yt = norm_jvp(x, w, m, rs, xt, wt, bt, ctx.center, ctx.offset, ctx.cast_x_hat)
    return yt, None, None


def _vmap(info, in_dims, x, w, b, eps, center, offset, cast_x_hat):
    """A batch of row sets is one set of more rows. Batched weights (an ensemble of models
    vmapped over stacked parameters, ``torch.func.stack_module_state``) stay in the kernel as
    *grouped* weights: the (B * n_rows, n_cols) rows with a (B, n_cols) weight and bias, row
    ``i`` taking weight row ``i // n_rows`` -- the same arithmetic as B separate calls, in one
    pass, and the backward gives the (B, n_cols) gradients. An unbatched weight or bias next to
    a batched one is expanded to (B, n_cols); a weight already grouped (nested vmap) keeps its
    order: (B, G, n_cols) becomes B * G weights over B * G row sets."""
    n = info.batch_size
    xb = _transforms.front(x, in_dims[0], n)  # (B, n_rows, n_cols)
    x2 = xb.reshape(-1, xb.shape[-1])
    grouped = any(t is not None and t.dim() == 2 for t in (w, b))  # grouped already (nested vmap)
    if in_dims[1] is not None or in_dims[2] is not None or grouped:
        flat = lambda t, d: None if t is None else _transforms.front(t, d, n).reshape(-1, t.shape[-1]).contiguous()  # noqa: E731
        w, b = flat(w, in_dims[1]), flat(b, in_dims[2])
    y, mean, rstd = _Transform.apply(x2, w, b, eps, center, offset, cast_x_hat)
    return (y.view(xb.shape), mean.view(n, -1) if center else mean.new_empty((n, 0)), rstd.view(n, -1)), (0, 0, 0)


_Transform = _register.transform(
    "RowNorm", forward=_transform_forward, setup_context=_transform_setup, backward=_transform_backward,
    jvp=_jvp, vmap=_vmap,
    doc="LayerNorm (``center``) / RMSNorm of 2-D ``x``: ``apply(x, w, b, eps, center, offset, "
        "cast_x_hat)`` -> ``(y, mean, rstd)``.",
)


def _transformed(x, res, shape, w, b, eps, center, offset, cast_x_hat):
    """``(y, h)`` under a transform: ``h = x + res`` in torch ops (as the kernel rounds it), then
    the rows of ``h`` (``x``) through :data:`_Transform`."""
    from ..layouts import flat, rows
    from .reference import rms_eps

    h = None if res is None else x + res
    src = x if h is None else h
    eps = rms_eps(x, eps)
    y, _, _ = _Transform.apply(rows(src, shape), flat(w), flat(b), eps, center, offset, cast_x_hat)
    y = y.reshape(x.shape)
    if not center:
        y = y.contiguous(memory_format=output_memory_format(x))
    return y, h


# --------------------------------------------------------------------------
# Entry points: one function per op, taking the path normlab._backend.route
# decided (normlab.functional has judged the arguments)
# --------------------------------------------------------------------------


def _compiled(x, res, shape, w, b, eps, center, offset, cast_x_hat):
    """``(y, h)`` through ``torch.ops.normlab`` (what torch.compile traces)."""
    if eps is None:
        eps = torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps
    if res is None:
        if center:
            return _ops.layer_norm_fwd(x, w, b, shape, eps)[0], None
        return _ops.rms_norm_fwd(x, w, shape, offset, cast_x_hat, eps)[0], None
    if center:
        y, h, _, _ = _ops.add_layer_norm_fwd(x, res, w, b, shape, eps)
    else:
        y, h, _ = _ops.add_rms_norm_fwd(x, res, w, shape, offset, cast_x_hat, eps)
    return y, h


def layer_norm(path, x, normalized_shape, w, b, eps):
    """LayerNorm over the trailing ``normalized_shape`` dims of ``x`` on ``path``."""
    if path == REF:
        return ref_layer_norm(x, normalized_shape, w, b, eps)
    if path == TRANSFORM:
        return _transformed(x, None, normalized_shape, w, b, eps, True, 0.0, False)[0]
    if path == COMPILE:
        return _compiled(x, None, normalized_shape, w, b, eps, True, 0.0, False)[0]
    return _forward(x, normalized_shape, None, w, b, eps, True, 0.0, False, False)[0]


def rms_norm(path, x, normalized_shape, w, eps, offset=0.0, cast_x_hat=False):
    """RMSNorm over the trailing ``normalized_shape`` dims of ``x`` on ``path``; the weight applied
    as ``w + offset``, ``x_hat`` rounded to ``x``'s dtype first if ``cast_x_hat``; ``eps`` None: the
    machine epsilon of the accumulation dtype."""
    if path == REF:
        return ref_rms_norm(x, normalized_shape, w, eps, offset, cast_x_hat)
    if path == TRANSFORM:
        return _transformed(x, None, normalized_shape, w, None, eps, False, offset, cast_x_hat)[0]
    if path == COMPILE:
        return _compiled(x, None, normalized_shape, w, None, eps, False, offset, cast_x_hat)[0]
    return _forward(x, normalized_shape, None, w, None, eps, False, offset, cast_x_hat, False)[0]


def add_layer_norm(path, x, residual, normalized_shape, w, b, eps):
    """``h = x + residual``, ``y = layer_norm(h)`` on ``path``; returns ``(y, h)``."""
    if path == REF:
        return ref_add_layer_norm(x, residual, normalized_shape, w, b, eps)
    if path == TRANSFORM:
        return _transformed(x, residual, normalized_shape, w, b, eps, True, 0.0, False)
    if path == COMPILE:
        return _compiled(x, residual, normalized_shape, w, b, eps, True, 0.0, False)
    return _forward(x, normalized_shape, residual, w, b, eps, True, 0.0, False, False)[:2]


def add_rms_norm(path, x, residual, normalized_shape, w, eps, offset=0.0, cast_x_hat=False):
    """``h = x + residual``, ``y = rms_norm(h)`` on ``path``; returns ``(y, h)``."""
    if path == REF:
        return ref_add_rms_norm(x, residual, normalized_shape, w, eps, offset, cast_x_hat)
    if path == TRANSFORM:
        return _transformed(x, residual, normalized_shape, w, None, eps, False, offset, cast_x_hat)
    if path == COMPILE:
        return _compiled(x, residual, normalized_shape, w, None, eps, False, offset, cast_x_hat)
    return _forward(x, normalized_shape, residual, w, None, eps, False, offset, cast_x_hat, False)[:2]
