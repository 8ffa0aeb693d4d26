"""Filter Response Normalization: the math, its hand-derived backward, the autograd wiring.

Per sample and channel of ``x`` viewed as (N, C, S), S = H * W, with ``w``, ``b``, ``tau`` of (C,)::

    nu2  = mean_S(x^2)                  # (N, C, 1)
    r    = 1 / sqrt(nu2 + eps)          # (N, C, 1)
    xhat = x * r                        # not centred
    z    = xhat * w + b                 # (N, C, S)
    y    = max(z, tau)                  # the TLU; without tau, y = z

The backward (derivation: ``docs/derivations/frn.md``). ``max`` passes the gradient to the larger
argument and half of it to each at a tie (``torch.maximum``'s rule, so a tie at ``z == tau`` -- a
zero input with zero bias and tau -- gets timm's gradients)::

    m    = [z > tau] + [z == tau] / 2    # 1 without tau
    dz   = dy * m
    dtau = sum_{N,S}(dy * (1 - m))
    db   = sum_{N,S}(dz)
    dw   = sum_{N,S}(dz * xhat)
    g    = dz * w
    dx   = r * (g - xhat * mean_S(g * xhat))

Numerics: the statistic and the output in float32 for float16/bfloat16/float32 input and float64
for float64, the output rounded to the input's dtype once.
"""

from __future__ import annotations

import torch

from ..layouts import empty_output, output_memory_format
from ..numerics import acc_dtype


def _c(t, acc):
    return None if t is None else t.to(acc)[:, None]  # (C, 1)


def frn_ref(x, w, b, tau, eps):
    """FRN (and the TLU when ``tau`` is given) of 3-D ``x`` (N, C, S) in the accumulation dtype,
    rounded once to ``x``'s dtype. ``w``, ``b``, ``tau``: (C,) or None."""
    acc = acc_dtype(x.dtype)
    xa = x.to(acc)
    z = xa * torch.rsqrt((xa * xa).mean(2, keepdim=True) + eps)
    if w is not None:
        z = z * _c(w, acc)
    if b is not None:
        z = z + _c(b, acc)
    if tau is not None:
        z = torch.maximum(z, _c(tau, acc))
    return z.to(x.dtype)


def frn_backward_ref(dy, x, w, b, tau, eps, need_dx, need_dw, need_db, need_dtau):
    """``(dx, dw, db, dtau)`` of :func:`frn_ref` (None where not needed), in torch ops."""
    acc = acc_dtype(x.dtype)
    dya, xa = dy.to(acc), x.to(acc)
    r = torch.rsqrt((xa * xa).mean(2, keepdim=True) + eps)  # (N, C, 1)
    xhat = xa * r
    dx = dw = db = dtau = None
    dz = dya
    if tau is not None:
        z = xhat * _c(w, acc) if w is not None else xhat
        if b is not None:
            z = z + _c(b, acc)
        t = _c(tau, acc)
        m = (z > t).to(acc) + (z == t).to(acc) * 0.5  # torch.maximum's split at a tie
        dz = dya * m
        if need_dtau:
            dtau = (dya * (1 - m)).sum((0, 2)).to(tau.dtype)
    if need_dw:
        dw = (dz * xhat).sum((0, 2)).to(w.dtype)
    if need_db:
        db = dz.sum((0, 2)).to(b.dtype)
    if need_dx:
        g = dz * _c(w, acc) if w is not None else dz
        dx = (r * (g - xhat * (g * xhat).mean(2, keepdim=True))).to(x.dtype)
    return dx, dw, db, dtau


class FRNFunction(torch.autograd.Function):
    """``apply(x, w, b, tau, eps)`` -> ``y`` for a 3-D ``x`` (N, C, S), with the hand-derived
    backward; saves ``x`` and the parameters. Torch ops throughout: vmap batches it as it is."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, w, b, tau, eps):
        return frn_ref(x, w, b, tau, eps)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w, b, tau, eps = inputs
        ctx.save_for_backward(x, w, b, tau)
        ctx.eps = eps

    @staticmethod
    def backward(ctx, dy):
        x, w, b, tau = ctx.saved_tensors
        nx, nw, nb, nt, _ = ctx.needs_input_grad
        dx, dw, db, dtau = frn_backward_ref(dy, x, w, b, tau, ctx.eps, nx, nw and w is not None,
                                            nb and b is not None, nt and tau is not None)
        return dx, dw, db, dtau, None


def ref_frn(x, w, b, tau, eps, plain=False):
    """The REF path: FRN over each (sample, channel) of an (N, C, H, W) ``x``; the output in ``x``'s
    memory format. ``plain``: the forward in torch ops without the hand backward (torch.func)."""
    if x.numel() == 0:
        return empty_output(x, w, b, tau)
    x3 = x.reshape(x.shape[0], x.shape[1], -1)  # (N, C, S)
    y = frn_ref(x3, w, b, tau, eps) if plain else FRNFunction.apply(x3, w, b, tau, eps)
    return y.reshape(x.shape).contiguous(memory_format=output_memory_format(x))
