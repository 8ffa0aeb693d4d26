"""LayerNorm / RMSNorm on the ``"cpu"`` kernels: what is this family's own, handed to ``ops/_register``.

Layering (kernel -> launcher -> the op's forms -> entry point):

- ``kernels.py``: the Numba kernels, on numpy views of the tensors.
- ``launch.py``: the launchers :func:`_forward` / :func:`_backward`: allocate
  outputs, pass bfloat16/float16 tensors as their bits (``ops/_bf16.py``), run
  the kernel with torch's thread count.
- here, declared to ``ops/_register``: the custom ops ``normlab::layer_norm_fwd``,
  ``normlab::rms_norm_fwd``, ``normlab::add_layer_norm_fwd``,
  ``normlab::add_rms_norm_fwd`` (forward, differentiable) and
  ``normlab::layer_norm_bwd``, ``normlab::rms_norm_bwd`` (backward; not
  differentiable themselves), each with its fake; the eager twin
  ``RowNormEager`` and the transform Function ``RowNormTransform`` (with the
  forward-mode rule and the vmap rule: a batch of row sets is one set of more
  rows).
- entry points :func:`layer_norm`, :func:`rms_norm`, :func:`add_layer_norm`,
  :func:`add_rms_norm`: the backend table's ``"cpu"`` functions (the ``"ref"``
  ones are in ``reference.py``); ``_register.route`` picks the form that runs.

The forward saves only ``x`` (``h`` for the fused add), ``mean`` and ``rstd``;
the backward recomputes ``x_hat``. Under ``create_graph=True`` the backward
runs the reference analytic backward in differentiable torch ops instead, so
double backward works for ``"cpu"`` too.

(No ``from __future__ import annotations`` here: ``torch.library`` reads the
type hints of the custom ops to build their schemas.)
"""

from typing import Optional

import torch
from torch import Tensor

from .. import _register, _transforms
from .._common import acc_dtype, to_acc
from .reference import (
    flat,
    layer_norm_backward_ref,
    layer_norm_stats,
    like,
    norm_jvp,
    ref_layer_norm,
    ref_rms_norm,
    rms_eps,
    rms_like,
    rms_norm_backward_ref,
    rms_norm_stats,
    rows,
)
from .launch import _backward, _forward

# --------------------------------------------------------------------------
# The gradients (every form's backward)
# --------------------------------------------------------------------------


def _grads(ctx, dy, dh, x, w, mean, rstd, need_dw, need_db, eager=False):
    """``(dx, dw, db)`` of LayerNorm (``ctx.center``) or RMSNorm; ``dx`` includes ``dh``.

    ``eager``: call the launcher directly instead of the backward custom op.
    """
    if dy is None:  # only h was used (fused add)
        return dh, None, None
    need_dw = need_dw and w is not None
    need_db = need_db and ctx.center and ctx.b_dtype is not None
    if _transforms.differentiable_backward():  # create_graph=True: the differentiable reference backward
        shape = x.shape
        if w is not None and w.dim() == 2:  # grouped weights (vmap): rows as (G, rows per weight, n_cols)
            x, dy, w = _grouped(x, w.shape[0]), _grouped(dy, w.shape[0]), w.unsqueeze(1)
        xa = to_acc(x)
        if ctx.center:
            mean, rstd = layer_norm_stats(xa, ctx.eps)
            dx, dw, db = layer_norm_backward_ref(dy, x, w, mean, rstd, True, need_dw, need_db)
        else:
            rstd = rms_norm_stats(xa, ctx.eps)
            dx, dw = rms_norm_backward_ref(dy, x, w, rstd, True, need_dw, ctx.offset, ctx.cast_x_hat)
            db = None
        dx = dx.reshape(shape)
        if w is not None and w.dim() == 3:
            w = w.squeeze(1)
        if dh is not None:
            dx = dx + dh
    elif eager:
        dx, dw, db = _backward(dy, x, w, mean, rstd, dh, ctx.center, need_dw or need_db, ctx.offset,
                               ctx.cast_x_hat)
    elif ctx.center:
        dx, dw, db = layer_norm_bwd(dy, x, w, mean, rstd, dh, need_dw or need_db)
    else:
        dx, dw = rms_norm_bwd(dy, x, w, rstd, dh, need_dw, ctx.offset, ctx.cast_x_hat)
        db = None
    dw = (dw if dw.dtype == w.dtype else dw.to(w.dtype)) if need_dw else None
    db = (db if db.dtype == ctx.b_dtype else db.to(ctx.b_dtype)) if need_db else None
    return dx, dw, db


def _grouped(t: Tensor, g: int) -> Tensor:
    """2-D rows as (g, rows / g, n_cols): the rows of each of g grouped weights (see ``_vmap``)."""
    return t.reshape(g, -1, t.shape[-1])


def _keep(ctx, eps, center, offset, cast_x_hat, b):
    """What every form's backward reads besides the saved tensors."""
    ctx.eps = eps
    ctx.center = center
    ctx.offset = offset
    ctx.cast_x_hat = cast_x_hat
    ctx.b_dtype = b.dtype if b is not None else None
    ctx.set_materialize_grads(False)


# --------------------------------------------------------------------------
# Custom ops (torch.compile): forward with autograd, backward
# --------------------------------------------------------------------------


def _stats_like(x: Tensor, n: int) -> Tensor:
    return x.new_empty((n,), dtype=acc_dtype(x.dtype))


def _setup(ctx, x, w, b, eps, mean, rstd, center, stats, offset=0.0, cast_x_hat=False):
    ctx.save_for_backward(x, w, mean if center else None, rstd)
    _keep(ctx, eps, center, offset, cast_x_hat, b)
    ctx.mark_non_differentiable(*stats)


def _layer_norm_fwd(
    x: Tensor, w: Optional[Tensor], b: Optional[Tensor], eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """LayerNorm of 2-D ``x``: ``(y, mean, rstd)``."""
    y, _, mean, rstd = _forward(x, None, w, b, eps, center=True)
    return y, torch.from_numpy(mean), torch.from_numpy(rstd)


def _layer_norm_setup(ctx, inputs, output):
    x, w, b, eps = inputs
    _, mean, rstd = output
    _setup(ctx, x, w, b, eps, mean, rstd, True, (mean, rstd))


def _layer_norm_backward(ctx, dy, _dmean, _drstd):
    x, w, mean, rstd = ctx.saved_tensors
    dx, dw, db = _grads(ctx, dy, None, x, w, mean, rstd, *ctx.needs_input_grad[1:3])
    return dx, dw, db, None


layer_norm_fwd = _register.custom_op(
    "layer_norm_fwd", _layer_norm_fwd,
    fake=lambda x, w, b, eps: (x.new_empty(x.shape), _stats_like(x, x.shape[0]), _stats_like(x, x.shape[0])),
    backward=_layer_norm_backward, setup_context=_layer_norm_setup,
)


def _rms_norm_fwd(
    x: Tensor, w: Optional[Tensor], eps: float, offset: float, cast_x_hat: bool
) -> tuple[Tensor, Tensor]:
    """RMSNorm of 2-D ``x``: ``(y, rstd)``."""
    y, _, _, rstd = _forward(x, None, w, None, eps, False, offset, cast_x_hat)
    return y, torch.from_numpy(rstd)


def _rms_norm_setup(ctx, inputs, output):
    x, w, eps, offset, cast_x_hat = inputs
    _, rstd = output
    _setup(ctx, x, w, None, eps, None, rstd, False, (rstd,), offset, cast_x_hat)


def _rms_norm_backward(ctx, dy, _drstd):
    x, w, _, rstd = ctx.saved_tensors
    dx, dw, _ = _grads(ctx, dy, None, x, w, None, rstd, ctx.needs_input_grad[1], False)
    return dx, dw, None, None, None


rms_norm_fwd = _register.custom_op(
    "rms_norm_fwd", _rms_norm_fwd,
    fake=lambda x, w, eps, offset, cast_x_hat: (x.new_empty(x.shape), _stats_like(x, x.shape[0])),
    backward=_rms_norm_backward, setup_context=_rms_norm_setup,
)


def _add_layer_norm_fwd(
    x: Tensor, residual: Tensor, w: Optional[Tensor], b: Optional[Tensor], eps: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``h = x + residual`` and its LayerNorm in one pass: ``(y, h, mean, rstd)``."""
    y, h, mean, rstd = _forward(x, residual, w, b, eps, center=True)
    return y, h, torch.from_numpy(mean), torch.from_numpy(rstd)


def _add_layer_norm_setup(ctx, inputs, output):
    _, _, w, b, eps = inputs
    _, h, mean, rstd = output
    _setup(ctx, h, w, b, eps, mean, rstd, True, (mean, rstd))


def _add_layer_norm_backward(ctx, dy, dh, _dmean, _drstd):
    h, w, mean, rstd = ctx.saved_tensors
    dx, dw, db = _grads(ctx, dy, dh, h, w, mean, rstd, *ctx.needs_input_grad[2:4])
    return dx, dx, dw, db, None  # h = x + residual: both get dh_total


add_layer_norm_fwd = _register.custom_op(
    "add_layer_norm_fwd", _add_layer_norm_fwd,
    fake=lambda x, residual, w, b, eps: (x.new_empty(x.shape), x.new_empty(x.shape),
                                         _stats_like(x, x.shape[0]), _stats_like(x, x.shape[0])),
    backward=_add_layer_norm_backward, setup_context=_add_layer_norm_setup,
)


def _add_rms_norm_fwd(
    x: Tensor, residual: Tensor, w: Optional[Tensor], eps: float, offset: float, cast_x_hat: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """``h = x + residual`` and its RMSNorm in one pass: ``(y, h, rstd)``."""
    y, h, _, rstd = _forward(x, residual, w, None, eps, False, offset, cast_x_hat)
    return y, h, torch.from_numpy(rstd)


def _add_rms_norm_setup(ctx, inputs, output):
    _, _, w, eps, offset, cast_x_hat = inputs
    _, h, rstd = output
    _setup(ctx, h, w, None, eps, None, rstd, False, (rstd,), offset, cast_x_hat)


def _add_rms_norm_backward(ctx, dy, dh, _drstd):
    h, w, _, rstd = ctx.saved_tensors
    dx, dw, _ = _grads(ctx, dy, dh, h, w, None, rstd, ctx.needs_input_grad[2], False)
    return dx, dx, dw, None, None, None


add_rms_norm_fwd = _register.custom_op(
    "add_rms_norm_fwd", _add_rms_norm_fwd,
    fake=lambda x, residual, w, eps, offset, cast_x_hat: (x.new_empty(x.shape), x.new_empty(x.shape),
                                                          _stats_like(x, x.shape[0])),
    backward=_add_rms_norm_backward, setup_context=_add_rms_norm_setup,
)


def _layer_norm_bwd(
    dy: Tensor, x: Tensor, w: Optional[Tensor], mean: Tensor, rstd: Tensor, dh: Optional[Tensor], need_wb: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """LayerNorm gradients ``(dx + dh, dw, db)``; dw/db in the accumulation dtype, empty unless ``need_wb``."""
    return _backward(dy, x, w, mean, rstd, dh, True, need_wb)


def _layer_norm_bwd_fake(dy, x, w, mean, rstd, dh, need_wb):
    n = x.shape[1] if need_wb else 0
    return x.new_empty(x.shape), _stats_like(x, n), _stats_like(x, n)


layer_norm_bwd = _register.custom_op("layer_norm_bwd", _layer_norm_bwd, fake=_layer_norm_bwd_fake)


def _rms_norm_bwd(
    dy: Tensor, x: Tensor, w: Optional[Tensor], rstd: Tensor, dh: Optional[Tensor], need_dw: bool,
    offset: float, cast_x_hat: bool,
) -> tuple[Tensor, Tensor]:
    """RMSNorm gradients ``(dx + dh, dw)``; dw in the accumulation dtype, empty unless ``need_dw``."""
    empty = rstd.new_empty((0,))
    dx, dw, _ = _backward(dy, x, w, empty, rstd, dh, False, need_dw, offset, cast_x_hat)
    return dx, dw


rms_norm_bwd = _register.custom_op(
    "rms_norm_bwd", _rms_norm_bwd,
    fake=lambda dy, x, w, rstd, dh, need_dw, offset, cast_x_hat: (
        x.new_empty(x.shape), _stats_like(x, x.shape[1] if need_dw else 0)),
)


# --------------------------------------------------------------------------
# The eager twin: the launchers and the backward as one Function; the
# statistics stay numpy arrays on the node (outputs of no graph node: wrapping
# them as tensors would cost more than the kernel of a small call)
# --------------------------------------------------------------------------


def _eager_forward(ctx, x, res, w, b, eps, center, offset, cast_x_hat):
    y, h, mean, rstd = _forward(x, res, w, b, eps, center, offset, cast_x_hat)
    ctx.save_for_backward(h if h is not None else x, w)
    ctx.stats = mean, rstd
    ctx.has_res = res is not None
    _keep(ctx, eps, center, offset, cast_x_hat, b)
    return y, h


def _eager_backward(ctx, dy, dh):
    x, w = ctx.saved_tensors
    mean, rstd = ctx.stats
    need = ctx.needs_input_grad
    dx, dw, db = _grads(ctx, dy, dh, x, w, mean, rstd, need[2], need[3], eager=True)
    return dx, (dx if ctx.has_res else None), dw, db, None, None, None, None


_eager_apply = _register.eager(
    "RowNorm", _eager_forward, _eager_backward,
    "LayerNorm (``center``) / RMSNorm of 2-D ``x``, ``h = x + res`` first when ``res`` is given: "
    "``apply(x, res, w, b, eps, center, offset, cast_x_hat)`` -> ``(y, h)``.",
)


# --------------------------------------------------------------------------
# Under torch.func transforms and forward-mode AD (ops/_transforms.py):
# (y, mean, rstd), (n_rows,) statistics, not differentiable (mean empty for RMSNorm)
# --------------------------------------------------------------------------


def _transform_forward(x, w, b, eps, center, offset, cast_x_hat):
    y, _, mean, rstd = _forward(x, None, w, b, eps, center, offset, cast_x_hat)
    return y, torch.from_numpy(mean), torch.from_numpy(rstd)


def _transform_setup(ctx, inputs, output):
    x, w, b, eps, center, offset, cast_x_hat = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, w, mean, rstd)
    ctx.save_for_forward(x, w, mean, rstd)
    _keep(ctx, eps, center, offset, cast_x_hat, b)
    ctx.mark_non_differentiable(mean, rstd)


def _transform_backward(ctx, dy, _dmean, _drstd):
    x, w, mean, rstd = ctx.saved_tensors
    need = ctx.needs_input_grad
    dx, dw, db = _grads(ctx, dy, None, x, w, mean, rstd, need[1], need[2], eager=True)
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


# --------------------------------------------------------------------------
# Entry points: the backend table's "cpu" functions (normlab.functional has
# checked the arguments)
# --------------------------------------------------------------------------


def _norm(x, res, w, b, eps, center, offset=0.0, cast_x_hat=False):
    """``(y, h)`` of 2-D ``x`` (``h`` None without ``res``), by the form ``_register.route`` picks."""
    path = _register.route(x, w, b, res)
    if path == _register.EAGER:
        return _eager_apply(x, res, w, b, eps, center, offset, cast_x_hat)
    if path == _register.PLAIN:
        y, h, _, _ = _forward(x, res, w, b, eps, center, offset, cast_x_hat)
        return y, h
    if path == _register.TRANSFORM:  # h = x + res in torch ops (as the kernel rounds it), then the norm
        h = None if res is None else x + res
        y, _, _ = _Transform.apply(x if h is None else h, w, b, eps, center, offset, cast_x_hat)
        return y, h
    if res is None:
        if center:
            return layer_norm_fwd(x, w, b, eps)[0], None
        return rms_norm_fwd(x, w, eps, offset, cast_x_hat)[0], None
    if center:
        y, h, _, _ = add_layer_norm_fwd(x, res, w, b, eps)
    else:
        y, h, _ = add_rms_norm_fwd(x, res, w, eps, offset, cast_x_hat)
    return y, h


def layer_norm(x, normalized_shape, w, b, eps):
    """LayerNorm over the trailing ``normalized_shape`` dims of ``x``."""
    if 0 in normalized_shape:  # no value in a row
        return ref_layer_norm(x, normalized_shape, w, b, eps)
    # rows(): no copy here; _forward makes the one copy of a non-contiguous x
    return like(_norm(rows(x, normalized_shape), None, flat(w), flat(b), eps, True)[0], x)


def rms_norm(x, normalized_shape, w, eps, offset=0.0, cast_x_hat=False):
    """RMSNorm over the trailing ``normalized_shape`` dims of ``x``; the weight applied as
    ``w + offset``, ``x_hat`` rounded to ``x``'s dtype first if ``cast_x_hat``."""
    if 0 in normalized_shape:  # no value in a row
        return ref_rms_norm(x, normalized_shape, w, eps, offset, cast_x_hat)
    y, _ = _norm(rows(x, normalized_shape), None, flat(w), None, rms_eps(x, eps), False, offset, cast_x_hat)
    return rms_like(y, x)


def add_layer_norm(x, residual, normalized_shape, w, b, eps):
    """``h = x + residual``, ``y = layer_norm(h)``; returns ``(y, h)``."""
    if 0 in normalized_shape:  # no value in a row
        h = x + residual
        return ref_layer_norm(h, normalized_shape, w, b, eps), h
    y, h = _norm(rows(x, normalized_shape), rows(residual, normalized_shape), flat(w), flat(b), eps, True)
    return like(y, x), like(h, x)


def add_rms_norm(x, residual, normalized_shape, w, eps, offset=0.0, cast_x_hat=False):
    """``h = x + residual``, ``y = rms_norm(h)``; returns ``(y, h)``."""
    if 0 in normalized_shape:  # no value in a row
        h = x + residual
        return ref_rms_norm(h, normalized_shape, w, eps, offset, cast_x_hat), h
    y, h = _norm(rows(x, normalized_shape), rows(residual, normalized_shape), flat(w), None, rms_eps(x, eps),
                 False, offset, cast_x_hat)
    return like(y, x), like(h, x)
