"""DyT (Dynamic Tanh, Zhu et al., "Transformers without Normalization", CVPR 2025): the math,
its hand-derived backward and forward-mode rule, the autograd wiring.

DyT replaces a normalization layer by an elementwise squashing with a learned scale ``alpha``
(one scalar per layer) and the usual per-feature affine over the trailing ``normalized_shape``
dims::

    t = tanh(alpha * x)                 # (n_rows, n_cols)
    y = t * w + b                       # (n_rows, n_cols)

No statistic is computed: each value's output depends on that value alone. The backward, with
``g = dy * w`` and ``du = g * (1 - t^2)`` (``tanh' = 1 - tanh^2``)::

    dx     = du * alpha
    dalpha = sum(du * x)                # over every value: alpha is one scalar
    dw     = sum_rows(dy * t)           # (n_cols,)
    db     = sum_rows(dy)               # (n_cols,)

Numerics: ``alpha * x``, ``tanh`` and the affine are computed in float32 for
float16/bfloat16/float32 input and float64 for float64 (``ops/numerics.acc_dtype``), and the
output is rounded to the input's dtype once; the sums of the backward accumulate in the same
dtype. The derivation is in ``docs/derivations/dyt.md``.
"""

from __future__ import annotations

import torch

from .. import _transforms
from ..layouts import empty_output, flat, like, rows
from ..numerics import acc_dtype


def dyt_ref(x, alpha, w, b):
    """DyT of 2-D ``x`` (n_rows, n_cols): ``tanh(alpha * x) * w + b`` in the accumulation dtype,
    rounded once to ``x``'s dtype. ``alpha``: (1,); ``w``, ``b``: (n_cols,) or None."""
    acc = acc_dtype(x.dtype)
    y = torch.tanh(alpha.to(acc) * x.to(acc))
    if w is not None:
        y = y * w.to(acc)
    if b is not None:
        y = y + b.to(acc)
    return y.to(x.dtype)


def dyt_backward_ref(dy, x, alpha, w, need_dx, need_dalpha, need_dw, need_db):
    """``(dx, dalpha, dw, db)`` of :func:`dyt_ref` (None where not needed), in torch ops:
    differentiable again (double backward) and batched by vmap as they are."""
    acc = acc_dtype(x.dtype)
    dya, xa, a = dy.to(acc), x.to(acc), alpha.to(acc)
    t = torch.tanh(a * xa)
    dx = dalpha = dw = db = None
    if need_dx or need_dalpha:
        g = dya * w.to(acc) if w is not None else dya
        du = torch.ops.aten.tanh_backward(g, t)  # g * (1 - t^2), as torch's tanh derives it (one fma)
        if need_dx:
            dx = (du * a).to(x.dtype)
        if need_dalpha:
            dalpha = (du * xa).sum().reshape(alpha.shape).to(alpha.dtype)
    if need_dw:
        dw = (dya * t).sum(0).to(w.dtype)
    if need_db:
        db = dya.sum(0)
    return dx, dalpha, dw, db


def dyt_jvp(x, alpha, w, xt, alphat, wt, bt):
    """The forward-mode derivative of :func:`dyt_ref` along the tangents (None: zero):
    ``ydot = wdot * t + w * (1 - t^2) * (alphadot * x + alpha * xdot) + bdot``."""
    acc = acc_dtype(x.dtype)
    xa, a = x.to(acc), alpha.to(acc)
    t = torch.tanh(a * xa)
    yt = None
    if xt is not None or alphat is not None:
        ut = 0
        if alphat is not None:
            ut = alphat.to(acc) * xa
        if xt is not None:
            ut = ut + a * xt.to(acc)
        yt = (1 - t * t) * ut
        if w is not None:
            yt = yt * w.to(acc)
    if wt is not None:
        yt = t * wt.to(acc) if yt is None else yt + t * wt.to(acc)
    if bt is not None:
        yt = bt.to(acc).expand_as(xa) if yt is None else yt + bt.to(acc)
    return None if yt is None else yt.to(x.dtype)


class DyTFunction(torch.autograd.Function):
    """DyT of a 2-D ``x``: ``apply(x, alpha, w, b)`` -> ``y``, with the hand-derived backward and
    forward-mode rule. Saves ``x`` (not ``tanh(alpha * x)``, which the backward recomputes: one
    tensor of the input's size saved, as torch's own autograd of ``tanh`` saves its output).
    Written in torch ops throughout, so torch.func's vmap batches it as it is."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, alpha, w, b):
        return dyt_ref(x, alpha, w, b)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, alpha, w, b = inputs
        ctx.save_for_backward(x, alpha, w)
        ctx.save_for_forward(x, alpha, w)
        ctx.b_dtype = b.dtype if b is not None else None

    @staticmethod
    def backward(ctx, dy):
        x, alpha, w = ctx.saved_tensors
        need_dx, need_da, need_dw, need_db = ctx.needs_input_grad
        dx, da, dw, db = dyt_backward_ref(dy, x, alpha, w, need_dx, need_da, need_dw and w is not None,
                                          need_db and ctx.b_dtype is not None)
        return dx, da, dw, (None if db is None else db.to(ctx.b_dtype))

    @staticmethod
    def _jvp(ctx, xt, alphat, wt, bt):
        x, alpha, w = ctx.saved_tensors
        return dyt_jvp(x, alpha, w, xt, alphat, wt, bt)


def ref_dyt(x, normalized_shape, alpha, w, b):
    """The REF path: DyT over the trailing ``normalized_shape`` dims of ``x`` by :class:`DyTFunction`
    (``normalized_shape`` says which dims ``w`` and ``b`` run along). The output is contiguous."""
    if x.numel() == 0:  # no value: the empty output, differentiable in every parameter (zero gradients)
        return empty_output(x, alpha, w, b)
    y = _transforms.pick(DyTFunction).apply(rows(x, normalized_shape), alpha, flat(w), flat(b))
    return like(y, x).contiguous()
