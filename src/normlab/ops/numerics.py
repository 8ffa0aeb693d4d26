"""The accumulation dtype and the shifted two-pass moments that every family's math uses."""

from __future__ import annotations

import torch


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


def chan_merge(counts, means, m2s):
    """Merge per-rank ``(count, mean, M2)`` in order with Chan's formula; returns ``(N, mean, M2)``.

    ``means``/``m2s``: (C,) float64 per rank (numpy arrays or tensors); ranks
    with count 0 are skipped, the first non-empty one is taken as it is.
    """
    n, mean, m2 = 0.0, means[0] * 0.0, m2s[0] * 0.0
    for n_b, mean_b, m2_b in zip(counts, means, m2s):
        if n_b == 0:
            continue
        if n == 0:
            n, mean, m2 = n_b, mean_b, m2_b
            continue
        total = n + n_b
        delta = mean_b - mean  # (C,)
        mean = mean + delta * (n_b / total)  # (C,)
        m2 = m2 + m2_b + delta * delta * (n * n_b / total)  # (C,)
        n = total
    return n, mean, m2
