"""LayerNorm / RMSNorm ops: the ``"cpu"`` kernels as torch.library custom ops, and the entry points.

Layering (kernel -> launcher -> custom op -> entry point):

- ``kernels.py``: the Numba kernels, on numpy views of the tensors.
- ``launch.py``: the launchers :func:`_forward` / :func:`_backward`: allocate
  outputs, pass bfloat16/float16 tensors as their bits (``ops/_bf16.py``), run
  the kernel with torch's thread count.
- custom ops ``normlab::layer_norm_fwd``, ``normlab::rms_norm_fwd``,
  ``normlab::add_layer_norm_fwd``, ``normlab::add_rms_norm_fwd`` (forward,
  with ``register_autograd``) and ``normlab::layer_norm_bwd``,
  ``normlab::rms_norm_bwd`` (backward; not differentiable themselves). Each
  has a fake implementation, so ``torch.compile(fullgraph=True)`` traces them
  as single nodes.
- :class:`_EagerNorm`: the same launchers and backward as one
  ``autograd.Function``, for eager calls; the ``torch.library`` dispatch costs
  tens of microseconds a call, which is most of a small LayerNorm.
- entry points :func:`layer_norm`, :func:`rms_norm`, :func:`add_layer_norm`,
  :func:`add_rms_norm` (called by ``normlab.functional``): the reference path
  (``reference.py``) for ``backend="ref"``; for ``"cpu"``, the custom ops while
  ``torch.compile`` traces, :class:`_EagerNorm` otherwise.

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

from .. import _transforms
from .._launch import fast_apply
from .._launch import records as _records
from .._common import acc_dtype, empty_output, to_acc
from .reference import (
    norm_jvp,
    LayerNormFunction,
    RMSNormFunction,
    layer_norm_backward_ref,
    layer_norm_stats,
    rms_norm_backward_ref,
    rms_norm_stats,
)
from .launch import BWD_MAX_ROWS, BWD_MIN_CHUNKS, _ACC, _backward, _bwd_rows, _forward, _k  # noqa: F401

# --------------------------------------------------------------------------
# Custom ops: forward
# --------------------------------------------------------------------------


def _stats_like(x: Tensor, n: int) -> Tensor:
    return x.new_empty((n,), dtype=acc_dtype(x.dtype))


@torch.library.custom_op("normlab::layer_norm_fwd", mutates_args=(), device_types="cpu")
def layer_norm_fwd(
    x: Tensor, w: Optional[Tensor], b: Optional[Tensor], eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """LayerNorm of 2-D ``x``: ``(y, mean, rstd)``."""
    y, _, mean, rstd = _forward(x, None, w, b, eps, center=True)
    return y, torch.from_numpy(mean), torch.from_numpy(rstd)


@layer_norm_fwd.register_fake
def _(x, w, b, eps):
    return x.new_empty(x.shape), _stats_like(x, x.shape[0]), _stats_like(x, x.shape[0])


@torch.library.custom_op("normlab::rms_norm_fwd", mutates_args=(), device_types="cpu")
def rms_norm_fwd(
    x: Tensor, w: Optional[Tensor], eps: float, offset: float, cast_x_hat: bool
) -> tuple[Tensor, Tensor]:
    """RMSNorm of 2-D ``x``: ``(y, rstd)``."""
    y, _, _, rstd = _forward(x, None, w, None, eps, False, offset, cast_x_hat)
    return y, torch.from_numpy(rstd)


@rms_norm_fwd.register_fake
def _(x, w, eps, offset, cast_x_hat):
    return x.new_empty(x.shape), _stats_like(x, x.shape[0])


@torch.library.custom_op("normlab::add_layer_norm_fwd", mutates_args=(), device_types="cpu")
def add_layer_norm_fwd(
    x: Tensor, residual: Tensor, w: Optional[Tensor], b: Optional[Tensor], eps: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``h = x + residual`` and its LayerNorm in one pass: ``(y, h, mean, rstd)``."""
    y, h, mean, rstd = _forward(x, residual, w, b, eps, center=True)
    return y, h, torch.from_numpy(mean), torch.from_numpy(rstd)


@add_layer_norm_fwd.register_fake
def _(x, residual, w, b, eps):
    n = x.shape[0]
    return x.new_empty(x.shape), x.new_empty(x.shape), _stats_like(x, n), _stats_like(x, n)


@torch.library.custom_op("normlab::add_rms_norm_fwd", mutates_args=(), device_types="cpu")
def add_rms_norm_fwd(
    x: Tensor, residual: Tensor, w: Optional[Tensor], eps: float, offset: float, cast_x_hat: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """``h = x + residual`` and its RMSNorm in one pass: ``(y, h, rstd)``."""
    y, h, _, rstd = _forward(x, residual, w, None, eps, False, offset, cast_x_hat)
    return y, h, torch.from_numpy(rstd)


@add_rms_norm_fwd.register_fake
def _(x, residual, w, eps, offset, cast_x_hat):
    return x.new_empty(x.shape), x.new_empty(x.shape), _stats_like(x, x.shape[0])


# --------------------------------------------------------------------------
# Custom ops: backward (not differentiable; see _grads for create_graph=True)
# --------------------------------------------------------------------------


@torch.library.custom_op("normlab::layer_norm_bwd", mutates_args=(), device_types="cpu")
def layer_norm_bwd(
    dy: Tensor,
    x: Tensor,
    w: Optional[Tensor],
    mean: Tensor,
    rstd: Tensor,
    dh: Optional[Tensor],
    need_wb: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """LayerNorm gradients ``(dx + dh, dw, db)``; dw/db in the accumulation dtype, empty unless ``need_wb``."""
    return _backward(dy, x, w, mean, rstd, dh, True, need_wb)


@layer_norm_bwd.register_fake
def _(dy, x, w, mean, rstd, dh, need_wb):
    n = x.shape[1] if need_wb else 0
    return x.new_empty(x.shape), _stats_like(x, n), _stats_like(x, n)


@torch.library.custom_op("normlab::rms_norm_bwd", mutates_args=(), device_types="cpu")
def rms_norm_bwd(
    dy: Tensor, x: Tensor, w: Optional[Tensor], rstd: Tensor, dh: Optional[Tensor], need_dw: bool,
    offset: float, cast_x_hat: bool,
) -> tuple[Tensor, Tensor]:
    """RMSNorm gradients ``(dx + dh, dw)``; dw in the accumulation dtype, empty unless ``need_dw``."""
    empty = rstd.new_empty((0,))
    dx, dw, _ = _backward(dy, x, w, empty, rstd, dh, False, need_dw, offset, cast_x_hat)
    return dx, dw


@rms_norm_bwd.register_fake
def _(dy, x, w, rstd, dh, need_dw, offset, cast_x_hat):
    return x.new_empty(x.shape), _stats_like(x, x.shape[1] if need_dw else 0)


# --------------------------------------------------------------------------
# Autograd of the forward ops
# --------------------------------------------------------------------------


def _ln_grads(ctx, dy, dh, x, w, mean, rstd, need_dw, need_db, eager=False):
    """``(dx, dw, db)`` of LayerNorm (``ctx.center``) or RMSNorm; ``dx`` includes ``dh``.

    ``eager``: call the launcher directly instead of the backward custom op.
    """
    if dy is None:  # only h was used (fused add)
        return dh, None, None
    need_dw = need_dw and w is not None
    need_db = need_db and ctx.center and ctx.b_dtype is not None
    if _transforms.differentiable_backward():  # create_graph=True: the differentiable reference backward
        xa = to_acc(x)
        if ctx.center:
            mean, rstd = layer_norm_stats(xa, ctx.eps)
            dx, dw, db = layer_norm_backward_ref(dy, x, w, mean, rstd, True, need_dw, need_db)
        else:
            rstd = rms_norm_stats(xa, ctx.eps)
            dx, dw = rms_norm_backward_ref(dy, x, w, rstd, True, need_dw, ctx.offset, ctx.cast_x_hat)
            db = None
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


def _setup(ctx, x, w, b, eps, mean, rstd, center, stats, offset=0.0, cast_x_hat=False):
    ctx.save_for_backward(x, w, mean if center else None, rstd)
    ctx.eps = eps
    ctx.center = center
    ctx.offset = offset
    ctx.cast_x_hat = cast_x_hat
    ctx.b_dtype = b.dtype if b is not None else None
    ctx.mark_non_differentiable(*stats)
    ctx.set_materialize_grads(False)


def _layer_norm_setup(ctx, inputs, output):
    x, w, b, eps = inputs
    _, mean, rstd = output
    _setup(ctx, x, w, b, eps, mean, rstd, True, (mean, rstd))


def _layer_norm_backward(ctx, dy, _dmean, _drstd):
    x, w, mean, rstd = ctx.saved_tensors
    dx, dw, db = _ln_grads(ctx, dy, None, x, w, mean, rstd, *ctx.needs_input_grad[1:3])
    return dx, dw, db, None


def _rms_norm_setup(ctx, inputs, output):
    x, w, eps, offset, cast_x_hat = inputs
    _, rstd = output
    _setup(ctx, x, w, None, eps, None, rstd, False, (rstd,), offset, cast_x_hat)


def _rms_norm_backward(ctx, dy, _drstd):
    x, w, _, rstd = ctx.saved_tensors
    dx, dw, _ = _ln_grads(ctx, dy, None, x, w, None, rstd, ctx.needs_input_grad[1], False)
    return dx, dw, None, None, None


def _add_layer_norm_setup(ctx, inputs, output):
    _, _, w, b, eps = inputs
    _, h, mean, rstd = output
    _setup(ctx, h, w, b, eps, mean, rstd, True, (mean, rstd))


def _add_layer_norm_backward(ctx, dy, dh, _dmean, _drstd):
    h, w, mean, rstd = ctx.saved_tensors
    dx, dw, db = _ln_grads(ctx, dy, dh, h, w, mean, rstd, *ctx.needs_input_grad[2:4])
    return dx, dx, dw, db, None  # h = x + residual: both get dh_total


def _add_rms_norm_setup(ctx, inputs, output):
    _, _, w, eps, offset, cast_x_hat = inputs
    _, h, rstd = output
    _setup(ctx, h, w, None, eps, None, rstd, False, (rstd,), offset, cast_x_hat)


def _add_rms_norm_backward(ctx, dy, dh, _drstd):
    h, w, _, rstd = ctx.saved_tensors
    dx, dw, _ = _ln_grads(ctx, dy, dh, h, w, None, rstd, ctx.needs_input_grad[2], False)
    return dx, dx, dw, None, None, None


class _EagerNorm(torch.autograd.Function):
    """The custom ops' eager twin: same launchers, same backward, no dispatcher.

    Eager calls skip ``torch.library``'s Python dispatch (tens of microseconds
    a call, most of the cost of a small LayerNorm); ``torch.compile`` traces
    the custom ops instead (see the entry points). The statistics stay numpy
    arrays on ``ctx`` (they are outputs of no graph node; wrapping them as
    tensors would cost more than the kernel of a small call).
    """

    @staticmethod
    def forward(ctx, x, res, w, b, eps, center, offset, cast_x_hat):
        y, h, mean, rstd = _forward(x, res, w, b, eps, center, offset, cast_x_hat)
        ctx.save_for_backward(h if h is not None else x, w)
        ctx.stats = mean, rstd
        ctx.eps = eps
        ctx.center = center
        ctx.offset = offset
        ctx.cast_x_hat = cast_x_hat
        ctx.b_dtype = b.dtype if b is not None else None
        ctx.has_res = res is not None
        ctx.set_materialize_grads(False)
        return y, h

    @staticmethod
    def backward(ctx, dy, dh):
        x, w = ctx.saved_tensors
        mean, rstd = ctx.stats
        need = ctx.needs_input_grad
        dx, dw, db = _ln_grads(ctx, dy, dh, x, w, mean, rstd, need[2], need[3], eager=True)
        return dx, (dx if ctx.has_res else None), dw, db, None, None, None, None


_eager_apply = fast_apply(_EagerNorm)


def _eager_norm(x, res, w, b, eps, center, offset=0.0, cast_x_hat=False):
    """``(y, h)`` through :class:`_EagerNorm` when autograd records the call, else the launcher alone
    (under torch.func transforms and forward-mode AD: :class:`_TransformNorm`)."""
    if _transforms.active():
        return _transform_norm(x, res, w, b, eps, center, offset, cast_x_hat)
    if _records(x, w, b, res):
        return _eager_apply(x, res, w, b, eps, center, offset, cast_x_hat)
    y, h, _, _ = _forward(x, res, w, b, eps, center, offset, cast_x_hat)
    return y, h


class _TransformNorm(torch.autograd.Function):
    """LayerNorm (``center``) / RMSNorm of 2-D ``x`` on the kernels, under torch.func transforms
    and forward-mode AD (``ops/_transforms.py``): returns ``(y, mean, rstd)`` ((n_rows,)
    statistics, not differentiable; ``mean`` empty for RMSNorm)."""

    @staticmethod
    def forward(x, w, b, eps, center, offset, cast_x_hat):
        y, _, mean, rstd = _forward(x, None, w, b, eps, center, offset, cast_x_hat)
        return y, torch.from_numpy(mean), torch.from_numpy(rstd)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w, b, eps, center, offset, cast_x_hat = inputs
        _, mean, rstd = output
        ctx.save_for_backward(x, w, mean, rstd)
        ctx.save_for_forward(x, w, mean, rstd)
        ctx.eps = eps
        ctx.center = center
        ctx.offset = offset
        ctx.cast_x_hat = cast_x_hat
        ctx.b_dtype = b.dtype if b is not None else None
        ctx.mark_non_differentiable(mean, rstd)
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, dy, _dmean, _drstd):
        x, w, mean, rstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        dx, dw, db = _ln_grads(ctx, dy, None, x, w, mean, rstd, need[1], need[2], eager=True)
        return dx, dw, db, None, None, None, None

    @staticmethod
    def jvp(ctx, xt, wt, bt, _eps_t, _center_t, _offset_t, _cast_t):
        x, w, mean, rstd = ctx.saved_tensors
        m = mean.unsqueeze(1) if ctx.center else None
        yt = norm_jvp(x, w, m, rstd.unsqueeze(1), xt, wt, bt, ctx.center, ctx.offset, ctx.cast_x_hat)
        return yt, None, None

    @staticmethod
    def vmap(info, in_dims, x, w, b, eps, center, offset, cast_x_hat):
        """A batch of row sets is one set of more rows; a batched weight or bias is applied after
        the kernel (which then normalises without one, so its ``x_hat`` is rounded first: exactly
        the Llama variant, one rounding more than the others), in torch ops."""
        n = info.batch_size
        xb = _transforms.front(x, in_dims[0], n)  # (B, n_rows, n_cols)
        rows = xb.reshape(-1, xb.shape[-1])
        if in_dims[1] is None and in_dims[2] is None:
            y, mean, rstd = _TransformNorm.apply(rows, w, b, eps, center, offset, cast_x_hat)
        else:
            y, mean, rstd = _TransformNorm.apply(rows, None, None, eps, center, 0.0, False)
            wb = _transforms.front(w, in_dims[1], n)
            y = _affine_batched(y.view(xb.shape), None if wb is None else to_acc(wb) + offset,
                                _transforms.front(b, in_dims[2], n))
        return (y.view(xb.shape), mean.view(n, -1) if center else mean.new_empty((n, 0)), rstd.view(n, -1)), (0, 0, 0)


def _affine_batched(x_hat, w, b):
    """``x_hat * w + b`` for (B, n_rows, n_cols) ``x_hat`` and (B, n_cols) ``w``/``b`` (or None), in the
    accumulation dtype, rounded once to ``x_hat``'s dtype."""
    y = to_acc(x_hat)
    if w is not None:
        y = y * to_acc(w).unsqueeze(1)
    if b is not None:
        y = y + to_acc(b).unsqueeze(1)
    return y.to(x_hat.dtype)


def _transform_norm(x, res, w, b, eps, center, offset=0.0, cast_x_hat=False):
    """``(y, h)`` under a transform: ``h = x + res`` in torch ops (as the kernel rounds it), then the norm."""
    h = None if res is None else x + res
    y, _, _ = _TransformNorm.apply(x if h is None else h, w, b, eps, center, offset, cast_x_hat)
    return y, h


layer_norm_fwd.register_autograd(_layer_norm_backward, setup_context=_layer_norm_setup)
rms_norm_fwd.register_autograd(_rms_norm_backward, setup_context=_rms_norm_setup)
add_layer_norm_fwd.register_autograd(_add_layer_norm_backward, setup_context=_add_layer_norm_setup)
add_rms_norm_fwd.register_autograd(_add_rms_norm_backward, setup_context=_add_rms_norm_setup)

# --------------------------------------------------------------------------
# Entry points (called by normlab.functional after its argument checks)
# --------------------------------------------------------------------------


def _rows(x: Tensor, normalized_shape: tuple) -> Tensor:
    n_cols = 1
    for s in normalized_shape:
        n_cols *= s
    if x.dim() == 2 and x.shape[1] == n_cols:
        return x  # already (n_rows, n_cols): no view node in the autograd graph
    return x.reshape(-1, n_cols)  # (n_rows, n_cols); copies only if it must


def _eager() -> bool:
    """True outside ``torch.compile`` tracing: use :class:`_EagerNorm`, not the custom ops."""
    return not torch.compiler.is_compiling()


def _flat(p: Optional[Tensor]) -> Optional[Tensor]:
    return p.reshape(-1) if p is not None and p.dim() != 1 else p


def _like(t: Tensor, x: Tensor) -> Tensor:
    """``t`` in ``x``'s shape (no view node when it already is)."""
    return t if t.shape == x.shape else t.reshape(x.shape)


def _rms_eps(x: Tensor, eps: Optional[float]) -> float:
    return torch.finfo(acc_dtype(x.dtype)).eps if eps is None else eps


def layer_norm(x, normalized_shape, w, b, eps, backend="ref"):
    """LayerNorm over the trailing ``normalized_shape`` dims of ``x`` (arguments already checked)."""
    if 0 in normalized_shape:  # no value in a row: torch's (empty) output
        return empty_output(x, w, b)
    if backend == "cpu":
        x2 = _rows(x, normalized_shape)  # _forward makes the one copy of a non-contiguous x
        if _eager():
            y, _ = _eager_norm(x2, None, _flat(w), _flat(b), eps, True)
        else:
            y, _, _ = layer_norm_fwd(x2, _flat(w), _flat(b), eps)
        return _like(y, x)
    y = _transforms.pick(LayerNormFunction).apply(_rows(x, normalized_shape), _flat(w), _flat(b), eps)[0]
    return _like(y, x)


def rms_norm(x, normalized_shape, w, eps, backend="ref", offset=0.0, cast_x_hat=False):
    """RMSNorm over the trailing ``normalized_shape`` dims of ``x`` (arguments already checked);
    the weight applied as ``w + offset``, ``x_hat`` rounded to ``x``'s dtype first if ``cast_x_hat``."""
    if 0 in normalized_shape:  # no value in a row: torch's (empty) output
        return empty_output(x, w)
    eps = _rms_eps(x, eps)
    if backend == "cpu":
        x2 = _rows(x, normalized_shape)
        if _eager():
            y, _ = _eager_norm(x2, None, _flat(w), None, eps, False, offset, cast_x_hat)
        else:
            y, _ = rms_norm_fwd(x2, _flat(w), eps, offset, cast_x_hat)
        return _like(y, x)
    y = _transforms.pick(RMSNormFunction).apply(_rows(x, normalized_shape), _flat(w), eps, offset, cast_x_hat)[0]
    return _like(y, x)


def add_layer_norm(x, residual, normalized_shape, w, b, eps, backend="ref"):
    """``h = x + residual``, ``y = layer_norm(h)``; returns ``(y, h)`` (arguments already checked)."""
    if 0 in normalized_shape:  # no value in a row: torch's (empty) output
        h = x + residual
        return empty_output(h, w, b), h
    if backend == "cpu":
        x2 = _rows(x, normalized_shape)
        r2 = _rows(residual, normalized_shape)
        if _eager():
            y, h = _eager_norm(x2, r2, _flat(w), _flat(b), eps, True)
        else:
            y, h, _, _ = add_layer_norm_fwd(x2, r2, _flat(w), _flat(b), eps)
        return _like(y, x), _like(h, x)
    h = x + residual
    return layer_norm(h, normalized_shape, w, b, eps, "ref"), h


def add_rms_norm(x, residual, normalized_shape, w, eps, backend="ref", offset=0.0, cast_x_hat=False):
    """``h = x + residual``, ``y = rms_norm(h)``; returns ``(y, h)`` (arguments already checked)."""
    if 0 in normalized_shape:  # no value in a row: torch's (empty) output
        h = x + residual
        return empty_output(h, w), h
    if backend == "cpu":
        x2 = _rows(x, normalized_shape)
        r2 = _rows(residual, normalized_shape)
        eps = _rms_eps(x, eps)
        if _eager():
            y, h = _eager_norm(x2, r2, _flat(w), None, eps, False, offset, cast_x_hat)
        else:
            y, h, _ = add_rms_norm_fwd(x2, r2, _flat(w), eps, offset, cast_x_hat)
        return _like(y, x), _like(h, x)
    h = x + residual
    return rms_norm(h, normalized_shape, w, eps, "ref", offset, cast_x_hat), h
