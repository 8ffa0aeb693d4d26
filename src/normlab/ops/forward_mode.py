"""The forward-mode (jvp) rules every family shares: the tangent of ``x_hat`` and of the affine
map (derivation: ``docs/derivations/forward_mode.md``)."""

from __future__ import annotations

import torch


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
