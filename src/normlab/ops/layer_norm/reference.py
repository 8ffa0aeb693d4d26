"""LayerNorm and RMSNorm: the math, its hand-derived backward, the autograd wiring.

Both normalise each *row* of ``x`` viewed as ``(n_rows, n_cols)``, where
``n_cols`` is the product of ``normalized_shape`` (the trailing dims) and
``n_rows`` the product of every leading dim. No value from another row is ever
read, which is why the output of a sample does not depend on its batch.

LayerNorm::

    mean  = sum(x) / n_cols                          # (n_rows, 1)
    var   = sum((x - mean)^2) / n_cols               # (n_rows, 1)  biased
    rstd  = 1 / sqrt(var + eps)                      # (n_rows, 1)
    x_hat = (x - mean) * rstd                        # (n_rows, n_cols)
    y     = x_hat * w + b                            # (n_rows, n_cols)

RMSNorm (no centring, no bias)::

    rstd  = 1 / sqrt(sum(x^2) / n_cols + eps)        # (n_rows, 1)
    x_hat = x * rstd
    y     = x_hat * (w + offset)

RMSNorm's variants, as the models that use them define them:

- ``offset``: the weight is stored as ``w`` and applied as ``w + offset`` (Gemma:
  ``offset=1``, ``w`` initialised to zeros), added in the accumulation dtype.
- ``cast_x_hat`` (Llama): ``y = round(x_hat) * (w + offset)`` -- ``x_hat`` rounded to
  the input's dtype *before* the weight multiplies it, so a half-precision output
  holds the rounding of a product of two half-precision numbers. Without it
  (torch, Gemma) ``y = round(x_hat * w)``: one rounding at the end.

Numerics: statistics and every sum are computed in float32 for
float16/bfloat16/float32 input and in float64 for float64 input; the output is
cast to the input's dtype once, at the end. The variance is the biased one
(divide by ``n_cols``), as in ``torch.nn.LayerNorm``. The mean and variance come
from a shifted two-pass algorithm (``ops/numerics.shifted_mean_var``), never from
``E[x^2] - E[x]^2``. RMSNorm's default ``eps`` (``None``) is the machine epsilon
of the accumulation dtype, as in ``torch.nn.functional.rms_norm``.

The derivation of the backward is in ``docs/derivations/layer_norm.md``.
"""

from __future__ import annotations

import torch

from .. import _transforms
from ..forward_mode import affine_jvp, x_hat_jvp
from ..layouts import channels_as_rows, empty_output, flat, like, rms_norm_layout, rows
from ..numerics import acc_dtype, shifted_mean_var, to_acc

# --------------------------------------------------------------------------
# Reference forward: the formula in plain torch ops, in the accumulation dtype
# --------------------------------------------------------------------------


def layer_norm_stats(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row ``mean`` and ``rstd`` of a 2-D ``x`` (already in its accumulation dtype)."""
    mean, var, _ = shifted_mean_var(x, dim=(-1,))  # (n_rows, 1) each
    rstd = torch.rsqrt(var + eps)  # (n_rows, 1)
    return mean, rstd


def layer_norm_ref(
    x: torch.Tensor,
    w: torch.Tensor | None,
    b: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LayerNorm of a 2-D ``x`` (n_rows, n_cols); returns ``(y, mean, rstd)``.

    ``y`` has ``x``'s dtype; ``mean`` and ``rstd`` (n_rows, 1) are in the
    accumulation dtype and are what the backward needs besides ``x``.
    """
    xa = to_acc(x)  # (n_rows, n_cols)
    mean, var, xc = shifted_mean_var(xa, dim=(-1,))  # (n_rows, 1), (n_rows, 1), (n_rows, n_cols)
    rstd = torch.rsqrt(var + eps)  # (n_rows, 1)
    x_hat = xc * rstd  # (n_rows, n_cols)
    y = x_hat
    if w is not None:
        y = y * to_acc(w)  # (n_rows, n_cols)
    # torch adds a bias of 0 where there is none ((x - mean) * rstd * w + 0): a zero product
    # (x below the mean times rstd = 0 at eps = inf, or times w = 0) comes out as +0, not -0
    y = y + (to_acc(b) if b is not None else 0.0)  # (n_rows, n_cols)
    return y.to(x.dtype), mean, rstd


def rms_norm_stats(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-row ``rstd`` of a 2-D ``x`` (already in its accumulation dtype)."""
    mean_sq = (x * x).mean(dim=-1, keepdim=True)  # (n_rows, 1)
    return torch.rsqrt(mean_sq + eps)  # (n_rows, 1)


def weight_acc(w: torch.Tensor | None, offset: float) -> torch.Tensor | None:
    """The weight as applied, ``w + offset``, in the accumulation dtype (None stays None)."""
    if w is None:
        return None
    wa = to_acc(w)
    return wa + offset if offset != 0.0 else wa


def rounded_x_hat(x_hat: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x_hat`` (accumulation dtype) rounded to ``dtype`` and back: what the Llama-style weight
    multiplies. Differentiable as the identity, as autograd's casts are."""
    return x_hat.to(dtype).to(x_hat.dtype)


def rms_norm_ref(
    x: torch.Tensor, w: torch.Tensor | None, eps: float, offset: float = 0.0, cast_x_hat: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of a 2-D ``x`` (n_rows, n_cols); returns ``(y, rstd)``.

    ``y = x_hat * (w + offset)``, with ``x_hat`` first rounded to ``x``'s dtype when
    ``cast_x_hat`` (Llama); one rounding at the end otherwise.
    """
    xa = to_acc(x)  # (n_rows, n_cols)
    rstd = rms_norm_stats(xa, eps)  # (n_rows, 1)
    y = xa * rstd  # x_hat, (n_rows, n_cols)
    if cast_x_hat:
        y = rounded_x_hat(y, x.dtype)
    if w is not None:
        y = y * weight_acc(w, offset)
    return y.to(x.dtype), rstd


# --------------------------------------------------------------------------
# Analytic backward (see docs/derivations/layer_norm.md)
# --------------------------------------------------------------------------


def layer_norm_backward_ref(
    dy: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor | None,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    need_dx: bool = True,
    need_dw: bool = True,
    need_db: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Gradients of LayerNorm for 2-D ``x``; returns ``(dx, dw, db)``.

    With ``g = dy * w`` (the gradient arriving at ``x_hat``)::

        dx = rstd * ( g                              # term 1: through x directly
                      - mean(g)                      # term 2: through the mean
                      - x_hat * mean(g * x_hat) )    # term 3: through the variance
        dw = sum over rows of dy * x_hat
        db = sum over rows of dy

    Written in differentiable torch ops, so the backward has a backward
    (double backward) when it runs under ``create_graph=True``.
    """
    dya = to_acc(dy)  # (n_rows, n_cols)
    x_hat = (to_acc(x) - mean) * rstd  # (n_rows, n_cols)
    dx = dw = db = None
    if need_dx:
        g = dya * to_acc(w) if w is not None else dya  # (n_rows, n_cols)
        term1 = g
        term2 = g.mean(dim=-1, keepdim=True)  # (n_rows, 1)
        term3 = x_hat * (g * x_hat).mean(dim=-1, keepdim=True)  # (n_rows, n_cols)
        dx = (rstd * (term1 - term2 - term3)).to(x.dtype)
    if need_dw and w is not None:
        dw = (dya * x_hat).sum(dim=-2).to(w.dtype)  # (n_cols,); (G, n_cols) for (G, rows, n_cols) grouped rows
    if need_db:
        db = dya.sum(dim=-2)  # (n_cols,) (or (G, n_cols)), cast by the caller to b's dtype
    return dx, dw, db


def rms_norm_backward_ref(
    dy: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor | None,
    rstd: torch.Tensor,
    need_dx: bool = True,
    need_dw: bool = True,
    offset: float = 0.0,
    cast_x_hat: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Gradients of RMSNorm for 2-D ``x``; returns ``(dx, dw)``.

    With ``g = dy * (w + offset)`` and ``x_hat = x * rstd``::

        dx = rstd * ( g                              # term 1: through x directly
                      - x_hat * mean(g * x_hat) )    # term 2: through the mean square
        dw = sum over rows of dy * x_hat             # d(w + offset)/dw = 1

    ``cast_x_hat`` (Llama): the rounding of ``x_hat`` counts as the identity in ``dx`` (as
    autograd's cast does), and ``dw`` sums ``dy * round(x_hat)``, the value ``w`` multiplied.
    """
    dya = to_acc(dy)  # (n_rows, n_cols)
    x_hat = to_acc(x) * rstd  # (n_rows, n_cols)
    dx = dw = None
    if need_dx:
        g = dya * weight_acc(w, offset) if w is not None else dya  # (n_rows, n_cols)
        term1 = g
        term2 = x_hat * (g * x_hat).mean(dim=-1, keepdim=True)  # (n_rows, n_cols)
        dx = (rstd * (term1 - term2)).to(x.dtype)
    if need_dw and w is not None:
        seen = rounded_x_hat(x_hat, x.dtype) if cast_x_hat else x_hat  # what w multiplied
        dw = (dya * seen).sum(dim=-2).to(w.dtype)  # (n_cols,); (G, n_cols) for grouped rows
    return dx, dw


# --------------------------------------------------------------------------
# Autograd wiring
# --------------------------------------------------------------------------


def norm_jvp(x, w, mean, rstd, xt, wt, bt, center, offset=0.0, cast_x_hat=False):
    """Tangent of LayerNorm (``center``) or RMSNorm of 2-D ``x`` along tangents of ``x``, ``w``, ``b``
    (each may be None); ``mean``/``rstd`` are the forward's (n_rows, 1) statistics (``mean``
    unused for RMSNorm). Hand-derived: ``ops/forward_mode.x_hat_jvp`` and ``affine_jvp``; RMSNorm's
    variants apply ``w + offset`` and (``cast_x_hat``) pair ``w``'s tangent with the rounded
    ``x_hat`` (the rounding's own tangent is the identity, as the backward's)."""
    xa = to_acc(x)
    x_hat = (xa - mean) * rstd if center else xa * rstd  # (n_rows, n_cols)
    dx_hat = None if xt is None else x_hat_jvp(x_hat, rstd, to_acc(xt), (-1,), center)
    seen = rounded_x_hat(x_hat, x.dtype) if cast_x_hat else x_hat
    yt = affine_jvp(seen, dx_hat, weight_acc(w, offset), to_acc(wt), to_acc(bt))
    return None if yt is None else yt.to(x.dtype)


class LayerNormFunction(torch.autograd.Function):
    """LayerNorm on a 2-D ``x`` with the hand-derived backward and forward-mode rule.

    Returns ``(y, mean, rstd)`` (the statistics: (n_rows, 1), not differentiable).
    Saves ``x``, ``w``, ``mean`` and ``rstd`` -- not ``x_hat``, which the backward
    recomputes in one fused expression. Under ``create_graph=True`` the backward
    recomputes ``mean``/``rstd`` from ``x`` with differentiable ops, so the
    second derivative sees how the statistics depend on ``x``. Written in torch
    ops throughout, so torch.func's vmap batches it as it is (``generate_vmap_rule``).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(x, w, b, eps):
        return layer_norm_ref(x, w, b, eps)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w, b, eps = inputs
        _, mean, rstd = output
        ctx.save_for_backward(x, w, mean, rstd)
        ctx.save_for_forward(x, w, mean, rstd)
        ctx.eps = eps
        ctx.b_dtype = b.dtype if b is not None else None
        ctx.mark_non_differentiable(mean, rstd)

    @staticmethod
    def backward(ctx, dy, _dmean, _drstd):
        x, w, mean, rstd = ctx.saved_tensors
        if _transforms.differentiable_backward():  # double backward: statistics as functions of x
            mean, rstd = layer_norm_stats(to_acc(x), ctx.eps)
        need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
        dx, dw, db = layer_norm_backward_ref(dy, x, w, mean, rstd, need_dx, need_dw, need_db)
        if db is not None:
            db = db.to(ctx.b_dtype)
        return dx, dw, db, None

    @staticmethod
    def _jvp(ctx, xt, wt, bt, _eps_t):
        x, w, mean, rstd = ctx.saved_tensors
        return norm_jvp(x, w, mean, rstd, xt, wt, bt, True), None, None


class RMSNormFunction(torch.autograd.Function):
    """RMSNorm on a 2-D ``x`` with the hand-derived backward and forward-mode rule.

    ``apply(x, w, eps, offset, cast_x_hat)`` returns ``(y, rstd)`` (``rstd`` (n_rows, 1), not
    differentiable); saves ``x``, ``w``, ``rstd``.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(x, w, eps, offset, cast_x_hat):
        return rms_norm_ref(x, w, eps, offset, cast_x_hat)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w, eps, offset, cast_x_hat = inputs
        _, rstd = output
        ctx.save_for_backward(x, w, rstd)
        ctx.save_for_forward(x, w, rstd)
        ctx.eps = eps
        ctx.offset = offset
        ctx.cast_x_hat = cast_x_hat
        ctx.mark_non_differentiable(rstd)

    @staticmethod
    def backward(ctx, dy, _drstd):
        x, w, rstd = ctx.saved_tensors
        if _transforms.differentiable_backward():  # double backward: rstd as a function of x
            rstd = rms_norm_stats(to_acc(x), ctx.eps)
        need_dx, need_dw = ctx.needs_input_grad[:2]
        dx, dw = rms_norm_backward_ref(dy, x, w, rstd, need_dx, need_dw, ctx.offset, ctx.cast_x_hat)
        return dx, dw, None, None, None

    @staticmethod
    def _jvp(ctx, xt, wt, _eps_t, _offset_t, _cast_t):
        x, w, rstd = ctx.saved_tensors
        return norm_jvp(x, w, None, rstd, xt, wt, None, False, ctx.offset, ctx.cast_x_hat), None


# --------------------------------------------------------------------------
# The REF path (what normlab.functional runs when normlab._backend.route says REF;
# normlab.functional has checked the arguments)
# --------------------------------------------------------------------------


def rms_eps(x: torch.Tensor, eps: float | None) -> float:
    """RMSNorm's ``eps``: ``None`` is the machine epsilon of the accumulation dtype, as in torch."""
    return torch.finfo(acc_dtype(x.dtype)).eps if eps is None else eps


def ref_layer_norm(x, normalized_shape, w, b, eps):
    """LayerNorm over the trailing ``normalized_shape`` dims of ``x`` by :class:`LayerNormFunction`."""
    if 0 in normalized_shape:  # no value in a row: torch's (empty) output
        return empty_output(x, w, b)
    y = _transforms.pick(LayerNormFunction).apply(rows(x, normalized_shape), flat(w), flat(b), eps)[0]
    return like(y, x).contiguous()  # torch's layer_norm output is contiguous whatever x's strides


def ref_rms_norm(x, normalized_shape, w, eps, offset=0.0, cast_x_hat=False):
    """RMSNorm over the trailing ``normalized_shape`` dims of ``x`` by :class:`RMSNormFunction`; the
    weight applied as ``w + offset``, ``x_hat`` rounded to ``x``'s dtype first if ``cast_x_hat``."""
    if 0 in normalized_shape:  # no value in a row: torch's (empty) output
        return empty_output(x, w)
    eps = rms_eps(x, eps)
    y = _transforms.pick(RMSNormFunction).apply(rows(x, normalized_shape), flat(w), eps, offset, cast_x_hat)[0]
    return rms_norm_layout(y, x)


def ref_add_layer_norm(x, residual, normalized_shape, w, b, eps):
    """``h = x + residual``, ``y = layer_norm(h)``; returns ``(y, h)``."""
    h = x + residual
    return ref_layer_norm(h, normalized_shape, w, b, eps), h


def ref_add_rms_norm(x, residual, normalized_shape, w, eps, offset=0.0, cast_x_hat=False):
    """``h = x + residual``, ``y = rms_norm(h)``; returns ``(y, h)``."""
    h = x + residual
    return ref_rms_norm(h, normalized_shape, w, eps, offset, cast_x_hat), h


# --------------------------------------------------------------------------
# LayerNorm2d: LayerNorm over dim 1 of (N, C, *), as rows
# --------------------------------------------------------------------------


def ref_layer_norm2d(x, w, b, eps):
    """The ``"ref"`` LayerNorm2d: :func:`ref_layer_norm` over the channels of every position."""
    return channels_as_rows(ref_layer_norm, x, w, b, eps)
