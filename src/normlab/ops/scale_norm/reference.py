"""Scale-only row norms: the math, its hand-derived backward, the autograd wiring.

Over each row of ``x`` (n_rows, n_cols) -- the trailing ``normalized_shape`` dims (SimpleNorm), or
the channels of an (N, C, H, W) input (RmsNorm2d, SimpleNorm2d) -- with ``n = n_cols``::

    s    = mean(x^2)                       # kind "rms"    (timm's rms_norm2d)        (n_rows, 1)
    s    = sum((x - mean(x))^2) / (n - 1)  # kind "simple" (timm's simple_norm: torch.var,
                                           #                unbiased)                 (n_rows, 1)
    r    = 1 / sqrt(s + eps)                                                          # (n_rows, 1)
    xhat = x * r                           # not centred: the mean is never subtracted
    y    = xhat * w                                                                   # (n_rows, n_cols)

The backward, with ``g = dy * w`` (derivation: ``docs/derivations/scale_norm.md``)::

    rms:    dx = r * (g - xhat * mean(g * xhat))
    simple: dx = r * (g - (x - mean(x)) * r * sum(g * xhat) / (n - 1))
    dw = sum_rows(dy * xhat)

A row of one value has no unbiased variance: ``simple`` gives NaN there, as ``torch.var`` does.

Numerics: statistics in float32 for float16/bfloat16/float32 input and float64 for float64 (the
variance by the shifted two passes), the output rounded to the input's dtype once.
"""

from __future__ import annotations

import torch

from .. import _transforms
from ..layouts import empty_output, flat, like, output_memory_format, rows
from ..numerics import acc_dtype, shifted_mean_var

KINDS = ("rms", "simple")


def _stats(xa, kind):
    """``(s, xc)``: the rows' statistic ``s`` and their centred values (None for "rms"); ``xa`` is
    already in the accumulation dtype."""
    if kind == "rms":
        return (xa * xa).mean(1, keepdim=True), None  # (n_rows, 1)
    _, _, xc = shifted_mean_var(xa, (1,))
    return (xc * xc).sum(1, keepdim=True) / (xa.shape[1] - 1), xc  # (n_rows, 1): 0/0 = NaN for n = 1


def scale_norm_ref(x, w, eps, kind):
    """``x * rsqrt(s + eps) * w`` of 2-D ``x`` (n_rows, n_cols) in the accumulation dtype, rounded
    once to ``x``'s dtype. ``w``: (n_cols,) or None; ``kind``: "rms" or "simple"."""
    acc = acc_dtype(x.dtype)
    xa = x.to(acc)
    s, _ = _stats(xa, kind)
    y = xa * torch.rsqrt(s + eps)
    if w is not None:
        y = y * w.to(acc)
    return y.to(x.dtype)


def scale_norm_backward_ref(dy, x, w, eps, kind, need_dx, need_dw):
    """``(dx, dw)`` of :func:`scale_norm_ref` (None where not needed), in torch ops: differentiable
    again (double backward) and batched by vmap as they are."""
    acc = acc_dtype(x.dtype)
    dya, xa = dy.to(acc), x.to(acc)
    s, xc = _stats(xa, kind)
    r = torch.rsqrt(s + eps)  # (n_rows, 1)
    xhat = xa * r
    dx = dw = None
    if need_dx:
        g = dya * w.to(acc) if w is not None else dya
        if kind == "rms":
            dx = r * (g - xhat * (g * xhat).mean(1, keepdim=True))  # term 1: g r; term 2: through s
        else:
            dx = r * (g - xc * r * ((g * xhat).sum(1, keepdim=True) / (xa.shape[1] - 1)))
        dx = dx.to(x.dtype)
    if need_dw:
        dw = (dya * xhat).sum(0).to(w.dtype)
    return dx, dw


class ScaleNormFunction(torch.autograd.Function):
    """``apply(x, w, eps, kind)`` -> ``y`` for a 2-D ``x``, with the hand-derived backward; saves
    ``x`` and ``w`` (the statistic is recomputed). Torch ops throughout: vmap batches it as it is."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, w, eps, kind):
        return scale_norm_ref(x, w, eps, kind)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w, eps, kind = inputs
        ctx.save_for_backward(x, w)
        ctx.eps, ctx.kind = eps, kind

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dx, dw = scale_norm_backward_ref(dy, x, w, ctx.eps, ctx.kind, ctx.needs_input_grad[0],
                                         ctx.needs_input_grad[1] and w is not None)
        return dx, dw, None, None


def _apply(x2, w, eps, kind, plain):
    if plain:  # under torch.func transforms and forward-mode AD: the torch ops themselves
        return scale_norm_ref(x2, w, eps, kind)
    return ScaleNormFunction.apply(x2, w, eps, kind)


def ref_scale_norm(x, normalized_shape, w, eps, kind, channels=False, plain=False):
    """The REF path. ``channels=False``: over the trailing ``normalized_shape`` dims of ``x`` (output
    contiguous). ``channels=True``: over dim 1 of an (N, C, H, W) ``x`` (output in ``x``'s memory
    format). ``plain``: the forward in torch ops without the hand backward (torch.func transforms)."""
    if x.numel() == 0:
        return empty_output(x, w)
    if not channels:
        return like(_apply(rows(x, normalized_shape), flat(w), eps, kind, plain), x).contiguous()
    xr = x.movedim(1, -1)  # (N, H, W, C)
    y = _apply(xr.reshape(-1, x.shape[1]), w, eps, kind, plain).reshape(xr.shape).movedim(-1, 1)
    return y.contiguous(memory_format=output_memory_format(x))
