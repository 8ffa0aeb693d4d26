"""EvoNorm B0 and S0: the math, the hand-derived backward, the autograd wiring.

B0, on ``x`` viewed as (N, C, S), S = H * W, with ``v``, ``w``, ``b`` of (C,)::

    left  = sqrt(var_{N,S}(x) + eps)    # (1, C, 1) batch variance (biased) in training,
                                        #           the running variance in eval
    sig   = sqrt(var_S(x) + eps)        # (N, C, 1) instance std (biased)
    right = x * v + sig                 # (N, C, S)
    d     = max(left, right)
    y     = x / d * w + b

S0, on ``x`` viewed as (N, G, Cg, S) (G groups of Cg channels)::

    sig = sqrt(var_{Cg,S}(x) + eps)     # (N, G, 1, 1) group std (biased)
    u   = x * sigmoid(v * x)            # the swish with a learned slope
    y   = u / sig * w + b

Without ``v`` (``apply_act=False``) both are ``x * w + b``. The backward (derivation:
``docs/derivations/evo_norm.md``), with ``g = dy * w``:

B0 (``m = [left > right] + [left == right] / 2``, ``torch.maximum``'s split at a tie;
``dd = -g * x / d^2``; ``M = N * S``)::

    dx = g / d + (1 - m) dd v + (x - mean_S(x)) / (S sig) * sum_S((1 - m) dd)
              + (x - mean_{N,S}(x)) / (M left) * sum_{N,S}(m dd)        # training only
    dv = sum_{N,S}((1 - m) dd x);  dw = sum_{N,S}(dy x / d);  db = sum_{N,S}(dy)

S0 (``s = sigmoid(v x)``, ``M = Cg * S``)::

    dx = g / sig * (s + v x s (1 - s)) - (x - mean(x)) / (M sig) * sum_{Cg,S}(g u) / sig^2
    dv = sum_{N,S}(g / sig * x^2 s (1 - s));  dw = sum_{N,S}(dy u / sig);  db = sum_{N,S}(dy)

Numerics: statistics (by the shifted two passes) and the output in float32 for
float16/bfloat16/float32 input and float64 for float64, the output rounded to the input's dtype
once.
"""

from __future__ import annotations

import torch

from ..layouts import empty_output, grouped, output_memory_format
from ..numerics import acc_dtype, shifted_mean_var


def _c(t, acc):
    return None if t is None else t.to(acc)[:, None]  # (C, 1)


def _affine(y, w, b, acc):
    if w is not None:
        y = y * _c(w, acc)
    if b is not None:
        y = y + _c(b, acc)
    return y


# -- B0 -----------------------------------------------------------------------------------------


def _b0_parts(xa, v, running_var, eps, training):
    """``(left, sig, right, xc_batch, xc_inst)`` of B0 on ``xa`` (N, C, S) in the accumulation dtype."""
    if training:
        _, var_c, xc_c = shifted_mean_var(xa, (0, 2))  # (1, C, 1), centred over the batch
        left = torch.sqrt(var_c + eps)
    else:
        left, xc_c = torch.sqrt(running_var.to(xa.dtype) + eps)[:, None], None  # (C, 1)
    _, var_i, xc_i = shifted_mean_var(xa, (2,))  # (N, C, 1)
    sig = torch.sqrt(var_i + eps)
    return left, sig, xa * _c(v, xa.dtype) + sig, xc_c, xc_i


def evo_b0_ref(x, v, w, b, running_var, eps, training):
    """EvoNorm B0 of 3-D ``x`` (N, C, S), rounded once to ``x``'s dtype (``v`` None: the affine alone)."""
    acc = acc_dtype(x.dtype)
    xa = x.to(acc)
    if v is not None:
        left, _, right, _, _ = _b0_parts(xa, v, running_var, eps, training)
        xa = xa / torch.maximum(left.expand_as(right), right)
    y = _affine(xa, w, b, acc).to(x.dtype)
    return y.clone() if y is x else y  # no affine, no v: a new tensor (autograd saves x)


def evo_b0_backward_ref(dy, x, v, w, running_var, eps, training, need_dx, need_dv, need_dw, need_db):
    """``(dx, dv, dw, db)`` of :func:`evo_b0_ref` (None where not needed), in torch ops."""
    acc = acc_dtype(x.dtype)
    dya, xa = dy.to(acc), x.to(acc)
    dx = dv = dw = db = None
    if need_db:
        db = dya.sum((0, 2))
    g = dya * _c(w, acc) if w is not None else dya
    if v is None:
        if need_dx:
            dx = g.to(x.dtype)
        if need_dw:
            dw = (dya * xa).sum((0, 2)).to(w.dtype)
        return dx, dv, dw, db
    left, sig, right, xc_c, xc_i = _b0_parts(xa, v, running_var, eps, training)
    left = left.expand_as(right)
    d = torch.maximum(left, right)
    m = (left > right).to(acc) + (left == right).to(acc) * 0.5  # the share of the gradient left gets
    dd = -g * xa / (d * d)  # dL/dd
    dr = dd * (1 - m)  # through right = x v + sig
    if need_dx:
        n_s = xa.shape[2]
        dx = g / d + dr * _c(v, acc) + xc_i / (n_s * sig) * dr.sum(2, keepdim=True)
        if training:  # through left = sqrt(batch variance + eps)
            dl = dd * m
            dx = dx + xc_c / (xa.shape[0] * n_s * left[:1]) * dl.sum((0, 2), keepdim=True)
        dx = dx.to(x.dtype)
    if need_dv:
        dv = (dr * xa).sum((0, 2)).to(v.dtype)
    if need_dw:
        dw = (dya * xa / d).sum((0, 2)).to(w.dtype)
    return dx, dv, dw, db


class EvoB0Function(torch.autograd.Function):
    """``apply(x, v, w, b, running_var, eps, training)`` -> ``y`` for a 3-D ``x`` (N, C, S), with the
    hand-derived backward (``running_var``: read in eval, not differentiated)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, v, w, b, running_var, eps, training):
        return evo_b0_ref(x, v, w, b, running_var, eps, training)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, v, w, b, running_var, eps, training = inputs
        ctx.save_for_backward(x, v, w, running_var)
        ctx.eps, ctx.training, ctx.b_dtype = eps, training, None if b is None else b.dtype

    @staticmethod
    def backward(ctx, dy):
        x, v, w, running_var = ctx.saved_tensors
        nx, nv, nw, nb = ctx.needs_input_grad[:4]
        dx, dv, dw, db = evo_b0_backward_ref(dy, x, v, w, running_var, ctx.eps, ctx.training, nx,
                                             nv and v is not None, nw and w is not None,
                                             nb and ctx.b_dtype is not None)
        return dx, dv, dw, (None if db is None else db.to(ctx.b_dtype)), None, None, None


def batch_var(x):
    """The biased variance of (N, C, H, W) ``x`` per channel (C,), in the accumulation dtype (the
    shifted two passes): what B0 normalises by in training, and the running variance's update."""
    _, var, _ = shifted_mean_var(x.to(acc_dtype(x.dtype)).reshape(x.shape[0], x.shape[1], -1), (0, 2))
    return var.reshape(-1)


def ref_evo_b0(x, v, w, b, running_var, eps, training, plain=False):
    """The REF path of B0 on an (N, C, H, W) ``x`` (output in ``x``'s memory format); ``plain``: the
    forward in torch ops without the hand backward (torch.func). Updates nothing."""
    if x.numel() == 0:
        return empty_output(x, v, w, b)
    x3 = x.reshape(x.shape[0], x.shape[1], -1)  # (N, C, S)
    fn = evo_b0_ref if plain else EvoB0Function.apply
    y = fn(x3, v, w, b, running_var, eps, training)
    return y.reshape(x.shape).contiguous(memory_format=output_memory_format(x))


# -- S0 -----------------------------------------------------------------------------------------


def _g(t, groups, acc):
    return None if t is None else t.to(acc).reshape(groups, -1, 1)  # (G, Cg, 1)


def evo_s0_ref(x, v, w, b, groups, eps):
    """EvoNorm S0 of 4-D ``x`` (N, G, Cg, S), rounded once to ``x``'s dtype (``v`` None: the affine alone)."""
    acc = acc_dtype(x.dtype)
    xa = x.to(acc)
    y = xa
    if v is not None:
        _, var, _ = shifted_mean_var(xa, (2, 3))  # (N, G, 1, 1)
        y = xa * torch.sigmoid(xa * _g(v, groups, acc)) / torch.sqrt(var + eps)
    if w is not None:
        y = y * _g(w, groups, acc)
    if b is not None:
        y = y + _g(b, groups, acc)
    y = y.to(x.dtype)
    return y.clone() if y is x else y  # no affine, no v: a new tensor (autograd saves x)


def evo_s0_backward_ref(dy, x, v, w, groups, eps, need_dx, need_dv, need_dw, need_db):
    """``(dx, dv, dw, db)`` of :func:`evo_s0_ref` (None where not needed), in torch ops."""
    acc = acc_dtype(x.dtype)
    dya, xa = dy.to(acc), x.to(acc)
    dx = dv = dw = db = None
    if need_db:
        db = dya.sum((0, 3)).reshape(-1)
    g = dya * _g(w, groups, acc) if w is not None else dya
    if v is None:
        if need_dx:
            dx = g.to(x.dtype)
        if need_dw:
            dw = (dya * xa).sum((0, 3)).reshape(-1).to(w.dtype)
        return dx, dv, dw, db
    _, var, xc = shifted_mean_var(xa, (2, 3))
    sig = torch.sqrt(var + eps)  # (N, G, 1, 1)
    vg = _g(v, groups, acc)
    s = torch.sigmoid(xa * vg)
    ds = s * (1 - s)  # sigmoid'
    u = xa * s
    gu = g / sig  # dL/du
    if need_dx:
        n_m = xa.shape[2] * xa.shape[3]
        dsig = -(gu * u).sum((2, 3), keepdim=True) / sig  # dL/dsig
        dx = (gu * (s + vg * xa * ds) + xc / (n_m * sig) * dsig).to(x.dtype)
    if need_dv:
        dv = (gu * xa * xa * ds).sum((0, 3)).reshape(-1).to(v.dtype)
    if need_dw:
        dw = (dya * u / sig).sum((0, 3)).reshape(-1).to(w.dtype)
    return dx, dv, dw, db


class EvoS0Function(torch.autograd.Function):
    """``apply(x, v, w, b, groups, eps)`` -> ``y`` for a 4-D ``x`` (N, G, Cg, S), with the
    hand-derived backward."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, v, w, b, groups, eps):
        return evo_s0_ref(x, v, w, b, groups, eps)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, v, w, b, groups, eps = inputs
        ctx.save_for_backward(x, v, w)
        ctx.groups, ctx.eps, ctx.b_dtype = groups, eps, None if b is None else b.dtype

    @staticmethod
    def backward(ctx, dy):
        x, v, w = ctx.saved_tensors
        nx, nv, nw, nb = ctx.needs_input_grad[:4]
        dx, dv, dw, db = evo_s0_backward_ref(dy, x, v, w, ctx.groups, ctx.eps, nx, nv and v is not None,
                                             nw and w is not None, nb and ctx.b_dtype is not None)
        return dx, dv, dw, (None if db is None else db.to(ctx.b_dtype)), None, None


def ref_evo_s0(x, v, w, b, groups, eps, plain=False):
    """The REF path of S0 on an (N, C, H, W) ``x`` (output in ``x``'s memory format); ``plain``: the
    forward in torch ops without the hand backward (torch.func)."""
    if x.numel() == 0:
        return empty_output(x, v, w, b)
    if v is None:
        groups = 1  # the affine alone: any grouping of the channels serves
    xg = grouped(x, groups)  # (N, G, Cg, S)
    fn = evo_s0_ref if plain else EvoS0Function.apply
    y = fn(xg, v, w, b, groups, eps)
    return y.reshape(x.shape).contiguous(memory_format=output_memory_format(x))
