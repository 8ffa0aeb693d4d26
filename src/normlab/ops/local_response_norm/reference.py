"""Local response normalization (Krizhevsky, Sutskever and Hinton, "ImageNet Classification with
Deep Convolutional Neural Networks", 2012): the math, its hand-derived backward and forward-mode
rule, the autograd wiring.

For an input of shape (N, C, *), each value is divided by a power of the sum of squares of the
values at the same place in a window of channels around its own::

    s[c]   = sum_{j in W(c)} x[j]^2          # (N, C, R): R = the flattened trailing dims
    base   = k + alpha * s / size            # the average over ``size`` slots (zeros padded)
    y      = x / base^beta

The window ``W(c)``, as a 0/1 matrix ``M[c, j]`` (:func:`window`, the definition; the code
sums the band of offsets instead, ``size`` elementwise adds, and adds channel 0 where
``"cross_map"`` needs it), is where the two torch layers differ:

- ``"lrn"`` (torch.nn.LocalResponseNorm, ``torch.nn.functional.local_response_norm``): the
  channels ``c - size // 2 .. c + (size - 1) // 2`` that exist (odd ``size``: centred; even: one
  more before ``c`` than after);
- ``"cross_map"`` (torch.nn.CrossMapLRN2d, a port of Lua Torch's SpatialCrossMapLRN): with
  ``p = (size - 1) // 2 + 1``, the channels ``c - p + 1 .. c + p - 1`` that exist (even ``size``:
  ``size - 1`` of them) -- and channel 0 in every window: torch's running sum adds channel
  ``c + p - 1`` at each step but never subtracts channel 0 (it subtracts channel ``c - p`` only
  for ``c > p``). normlab reproduces that forward value for value, so that a model using it
  gives torch's outputs; its backward is the exact gradient of that forward (torch's own
  hand-written backward uses another window and fails ``gradcheck``).

Both divide by ``size``, whatever the number of channels in the window (the zeros padded count).

The backward, with ``r = dy * y / base``::

    dx = dy / base^beta - (2 * alpha * beta / size) * x * (M^T r)

and the forward-mode rule along ``xdot``::

    ydot = xdot / base^beta - (2 * alpha * beta / size) * (y / base) * (M (x * xdot))

Numerics: every step in float32 for float16/bfloat16/float32 input and float64 for float64
(``ops/numerics.acc_dtype``); the output is rounded to the input's dtype once. The derivation is
in ``docs/derivations/local_response_norm.md``.
"""

from __future__ import annotations

import torch

from .. import _transforms
from ..numerics import acc_dtype

KINDS = ("lrn", "cross_map")


def window(n_channels: int, size: int, kind: str, dtype=torch.float64, device=None) -> torch.Tensor:
    """The window as a 0/1 matrix ``M`` (n_channels, n_channels): ``M[c, j] = 1`` where channel ``j``
    is in channel ``c``'s sum of squares (``kind``: ``"lrn"`` or ``"cross_map"``; see the module
    docstring)."""
    c = torch.arange(n_channels, device=device).unsqueeze(1)  # (C, 1)
    j = torch.arange(n_channels, device=device).unsqueeze(0)  # (1, C)
    if kind == "lrn":
        inside = (j >= c - size // 2) & (j <= c + (size - 1) // 2)
    elif kind == "cross_map":
        p = (size - 1) // 2 + 1
        inside = (j <= c + p - 1) & ((j >= c - p + 1) | (j == 0))
    else:
        raise ValueError(f"local_response_norm: expected kind 'lrn' or 'cross_map', got {kind!r}")
    return inside.to(dtype)


def _bounds(size: int, kind: str) -> tuple[int, int]:
    """The band of channel ``c``'s window as offsets ``lo .. hi`` from ``c`` (``lo <= 0 <= hi``);
    ``"cross_map"`` adds channel 0 besides (:func:`_window_sum`)."""
    if kind == "lrn":
        return -(size // 2), (size - 1) // 2
    p = (size - 1) // 2 + 1
    return -(p - 1), p - 1


def _band(t, lo, hi):
    """``out[:, c] = sum_{o = lo..hi} t[:, c + o]`` over the channels (dim 1) of 3-D ``t`` (N, C, R),
    zeros beyond the ends: the offsets added one by one, lowest first (elementwise adds: the same
    bits on any number of threads)."""
    c = t.shape[1]
    lo, hi = max(lo, -(c - 1)), min(hi, c - 1)  # offsets past the ends add only zeros
    padded = torch.nn.functional.pad(t, (0, 0, -lo, hi))  # (N, C + hi - lo, R)
    out = padded[:, 0:c]
    for i in range(1, hi - lo + 1):
        out = out + padded[:, i:i + c]
    return out


def _window_sum(t, size, kind):
    """``M t`` over the channels of 3-D ``t``: each channel's window sum (see :func:`window`)."""
    lo, hi = _bounds(size, kind)
    s = _band(t, lo, hi)
    if kind == "cross_map" and t.shape[1] > 1 - lo:
        # channel 0 in every window: added where the band no longer reaches it (c > -lo)
        extra = torch.zeros_like(t[:, :1]).expand(-1, 1 - lo, -1)
        s = s + torch.cat([extra, t[:, :1].expand(-1, t.shape[1] + lo - 1, -1)], dim=1)
    return s


def _window_sum_t(t, size, kind):
    """``M^T t``: the transposed window, the backward's sum over the channels whose window holds
    each channel."""
    lo, hi = _bounds(size, kind)
    s = _band(t, -hi, -lo)
    if kind == "cross_map" and t.shape[1] > 1 - lo:
        # channel 0 gathers from every channel c > -lo (whose band does not reach it)
        head = t[:, 1 - lo:].sum(1, keepdim=True)  # (N, 1, R)
        s = s + torch.cat([head, torch.zeros_like(t[:, 1:])], dim=1)
    return s


def _base(xa, size, alpha, k, kind):
    """``k + alpha * s / size`` with ``s = M (x^2)`` over the channels of 3-D ``xa`` (N, C, R)."""
    s = _window_sum(xa * xa, size, kind)  # (N, C, R): each channel's window of squares
    return s / size * alpha + k


def local_response_norm_ref(x, size, alpha, beta, k, kind="lrn"):
    """LRN of 3-D ``x`` (N, C, R) across dim 1, in the accumulation dtype, rounded once to
    ``x``'s dtype."""
    xa = x.to(acc_dtype(x.dtype))
    return (xa / _base(xa, size, alpha, k, kind).pow(beta)).to(x.dtype)


def local_response_norm_backward_ref(dy, x, size, alpha, beta, k, kind="lrn"):
    """``dx`` of :func:`local_response_norm_ref`, in torch ops: differentiable again (double
    backward) and batched by vmap as it is."""
    acc = acc_dtype(x.dtype)
    dya, xa = dy.to(acc), x.to(acc)
    base = _base(xa, size, alpha, k, kind)  # (N, C, R)
    inv = base.pow(-beta)  # 1 / base^beta
    r = dya * xa * inv / base  # dy * y / base
    dx = dya * inv - (2.0 * alpha * beta / size) * xa * _window_sum_t(r, size, kind)  # term 1, term 2
    return dx.to(x.dtype)


def local_response_norm_jvp(x, xt, size, alpha, beta, k, kind="lrn"):
    """The forward-mode derivative of :func:`local_response_norm_ref` along ``xt``."""
    acc = acc_dtype(x.dtype)
    xa, xta = x.to(acc), xt.to(acc)
    base = _base(xa, size, alpha, k, kind)
    inv = base.pow(-beta)
    yt = xta * inv - (2.0 * alpha * beta / size) * (xa * inv / base) * _window_sum(xa * xta, size, kind)
    return yt.to(x.dtype)


class LocalResponseNormFunction(torch.autograd.Function):
    """LRN of a 3-D ``x`` (N, C, R): ``apply(x, size, alpha, beta, k, kind)`` -> ``y``, with the
    hand-derived backward and forward-mode rule. Saves ``x`` alone (the backward recomputes the
    window sums). Written in torch ops throughout, so torch.func's vmap batches it as it is."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, size, alpha, beta, k, kind):
        return local_response_norm_ref(x, size, alpha, beta, k, kind)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, ctx.size, ctx.alpha, ctx.beta, ctx.k, ctx.kind = inputs
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        dx = local_response_norm_backward_ref(dy, x, ctx.size, ctx.alpha, ctx.beta, ctx.k, ctx.kind)
        return dx, None, None, None, None, None

    @staticmethod
    def _jvp(ctx, xt, *_):
        (x,) = ctx.saved_tensors
        return local_response_norm_jvp(x, xt, ctx.size, ctx.alpha, ctx.beta, ctx.k, ctx.kind)


def ref_local_response_norm(x, size, alpha, beta, k, kind="lrn"):
    """The REF path: LRN of ``x`` (N, C, *) across dim 1 by :class:`LocalResponseNormFunction`.
    The output has ``x``'s shape and is contiguous; an empty ``x`` gives an empty copy."""
    if x.numel() == 0:
        return x.clone(memory_format=torch.contiguous_format)
    n, c = x.shape[0], x.shape[1]
    x3 = x.reshape(n, c, -1)  # (N, C, R)
    y = _transforms.pick(LocalResponseNormFunction).apply(x3, size, float(alpha), float(beta), float(k), kind)
    return y.reshape(x.shape)
