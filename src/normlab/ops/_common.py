"""Small helpers shared by every family in ``ops/``."""

from __future__ import annotations

import torch

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype statistics and sums are accumulated in.

    float16/bfloat16/float32 accumulate in float32; float64 in float64.
    """
    return torch.float64 if dtype == torch.float64 else torch.float32


def to_acc(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` in its accumulation dtype (no copy when it already is)."""
    if t is None:
        return None
    return t.to(acc_dtype(t.dtype))


def shifted_mean_var(
    x: torch.Tensor, dim: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean, biased variance and centred values of ``x`` over the dims ``dim``.

    Shifted two-pass algorithm. Each slice is first shifted by one of its own
    values (the element at index 0 of every reduced dim), then the mean and the
    biased variance of the shifted values are taken in two passes:

        shift = x[0]                      one value of the slice itself
        d     = x - shift                 exact when x and shift are close
        mean  = shift + mean(d)
        xc    = d - mean(d)               the centred values
        var   = mean(xc * xc)             biased: divide by n

    Why: float32 rows with a large mean against their spread (mean 1e4, std 1)
    lose digits in ``sum(x)/n`` -- the mean itself is rounded to a float32 of
    magnitude 1e4 (ulp ~1e-3). Shifting first keeps every sum at the scale of
    the spread, so the centred values are accurate to float32 rounding of O(1)
    numbers. A constant slice gives ``d == 0`` and so ``xc == 0`` exactly (its
    output is exactly the bias). ``E[x^2] - E[x]^2`` is never used.

    Returns ``(mean, var, xc)``; ``mean`` and ``var`` keep the reduced dims
    with size 1.
    """
    shift = x
    for d in dim:
        shift = shift.narrow(d, 0, 1)
    d = x - shift
    mean_d = d.mean(dim=dim, keepdim=True)
    xc = d - mean_d
    var = (xc * xc).mean(dim=dim, keepdim=True)
    mean = shift + mean_d
    return mean, var, xc


def empty_output(x: torch.Tensor, *params) -> torch.Tensor:
    """The (empty) output of a norm of an ``x`` with no value to normalise: 0 channels, or a
    ``normalized_shape`` with a 0. Differentiable in ``x`` and in ``params`` (their gradients
    are empty tensors, as torch gives)."""
    y = x.contiguous().clone()
    for p in params:
        if p is not None:
            y = y + p.sum()  # an empty sum: adds 0 to no value, links p into the graph
    return y


# --------------------------------------------------------------------------
# Forward mode (docs/derivations/forward_mode.md)
# --------------------------------------------------------------------------


def x_hat_jvp(x_hat: torch.Tensor, rstd: torch.Tensor, t: torch.Tensor, dims, center: bool) -> torch.Tensor:
    """The tangent of ``x_hat = (x - mean) * rstd`` along a tangent ``t`` of ``x``.

    ``mean`` and the variance are taken over ``dims``; differentiating them gives::

        d mean = mean(t)
        d rstd = -rstd * mean(t * x_hat)            (d var = 2 * mean(t * (x - mean)))
        d x_hat = rstd * (t - mean(t) - x_hat * mean(t * x_hat))

    RMSNorm (``center=False``: no mean, the variance is the mean square) drops
    ``mean(t)``. ``x_hat``, ``rstd`` and ``t`` in the accumulation dtype, ``rstd``
    broadcastable to ``x_hat``.
    """
    out = t - x_hat * (t * x_hat).mean(dim=dims, keepdim=True)
    if center:
        out = out - t.mean(dim=dims, keepdim=True)
    return rstd * out


def affine_jvp(x_hat, dx_hat, w, wt, bt):
    """The tangent of ``y = x_hat * w + b`` from those of ``x_hat``, ``w`` and ``b`` (each may be
    None: no tangent, or no parameter); ``w``, ``wt``, ``bt`` broadcast against ``x_hat``."""
    yt = None
    if dx_hat is not None:
        yt = dx_hat if w is None else dx_hat * w
    if wt is not None:
        yt = x_hat * wt if yt is None else yt + x_hat * wt
    if bt is not None:
        yt = bt.expand_as(x_hat) if yt is None else yt + bt
    return yt


def _channels_last_like(shape, strides, order) -> bool:
    """torch's ``is_channels_last_strides_2d/3d``: do the strides walk the dims in ``order``?

    ``order`` lists the dims from fastest to slowest (``(1, 3, 2, 0)`` for
    NHWC). Ambiguous cases (a channel stride of 0, size-1 dims with equal
    strides) fall back to contiguous, as in torch.
    """
    if strides[1] == 0:
        return False
    lowest = 0
    for d in order:
        if shape[d] == 0 or strides[d] < lowest:
            return False
        if d == 0 and lowest == strides[1]:  # N111-like: call it contiguous
            return False
        lowest = strides[d] * shape[d] if shape[d] > 1 else strides[d]
    return True


def output_memory_format(x: torch.Tensor) -> torch.memory_format:
    """``x.suggest_memory_format()``: the memory format torch gives the output of its CPU GroupNorm
    and of ``rms_norm`` (channels_last for a channels-last 4-D ``x``, channels_last_3d for 5-D)."""
    if x.dim() == 4 and _channels_last_like(x.shape, x.stride(), (1, 3, 2, 0)):
        return torch.channels_last
    if x.dim() == 5 and _channels_last_like(x.shape, x.stride(), (1, 4, 3, 2, 0)):
        return torch.channels_last_3d
    return torch.contiguous_format


def in_memory_format(t: torch.Tensor, fmt: torch.memory_format) -> torch.Tensor:
    """``t.contiguous(memory_format=fmt)`` with torch's own strides for every dim, as an output
    that torch allocated in ``fmt`` has them. A dim of size 1 can carry any stride, and a
    reshape picks one of its own (a (1, C, H, W) channels-last output came out with stride C
    for dim 0 where torch gives C*H*W); the memory is the same, so a view fixes it."""
    t = t.contiguous(memory_format=fmt)
    if 1 not in t.shape or t.numel() == 0:
        return t
    shape = t.shape
    if fmt == torch.channels_last:
        c, h, w = shape[1], shape[2], shape[3]
        strides = (c * h * w, 1, w * c, c)
    elif fmt == torch.channels_last_3d:
        c, d, h, w = shape[1], shape[2], shape[3], shape[4]
        strides = (c * d * h * w, 1, h * w * c, w * c, c)
    else:
        strides, acc = [], 1
        for size in reversed(shape):
            strides.append(acc)
            acc *= max(size, 1)
        strides = tuple(reversed(strides))
    return t if t.stride() == strides else t.as_strided(shape, strides)
