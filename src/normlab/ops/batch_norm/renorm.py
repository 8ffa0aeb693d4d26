"""Batch Renormalization (Ioffe, 2017): the correction ``r``, ``d`` that BatchNorm's kernel then applies.

Training, per channel, with the batch's mean ``mu_B`` and biased variance
``var_B`` and the running statistics ``mu``, ``var`` *before* this batch's
update::

    sigma_B = sqrt(var_B + eps)
    sigma   = sqrt(var + eps)
    r       = clip(sigma_B / sigma, 1 / r_max, r_max)        # constants for the
    d       = clip((mu_B - mu) / sigma, -d_max, d_max)       # backward: stop-gradient
    x_hat   = (x - mu_B) / sigma_B * r + d
    y       = w * x_hat + b

Since ``r`` and ``d`` are constants, ``y = (w * r) * xhat_B + (w * d + b)``: BatchNorm of
the batch with weight ``w * r`` and bias ``w * d + b``. So the batch runs through
``normlab.functional.batch_norm`` (its kernel, its backward through the batch
statistics, its running-statistics update) with those two vectors, and autograd
gives ``dw = r * dw' + d * db'``, ``db = db'``. The cost over BatchNorm: one
read of ``x`` for ``mu_B``, ``var_B`` (in float32 for half inputs). With
``r_max = 1``, ``d_max = 0``: ``r = 1``, ``d = 0``, and the call is BatchNorm's, bit for
bit. The derivation is in ``docs/derivations/batch_norm_variants.md``.
"""

from __future__ import annotations

import math

import torch

from ..numerics import acc_dtype


@torch.no_grad()
def renorm_factors(x, running_mean, running_var, eps, r_max, d_max):
    """``(r, d)``, each (C,) in ``x``'s accumulation dtype, not differentiable.

    ``r_max``, ``d_max``: floats, or 0-dim tensors (a warm-up computed from a step count
    inside a compiled graph).
    """
    acc = acc_dtype(x.dtype)
    dims = (0, *range(2, x.dim()))
    var_b, mu_b = torch.var_mean(x.to(acc), dim=dims, correction=0)  # (C,) each
    sigma = torch.sqrt(running_var.to(acc) + eps)  # (C,)
    # eps = inf: sigma_B / sigma is inf / inf; its limit is 1 (and d's is 0, as computed)
    r = torch.ones_like(var_b) if eps == math.inf else torch.sqrt(var_b + eps) / sigma
    d = (mu_b - running_mean.to(acc)) / sigma
    if isinstance(r_max, torch.Tensor) or isinstance(d_max, torch.Tensor):
        r_max = torch.as_tensor(r_max, dtype=acc)
        d_max = torch.as_tensor(d_max, dtype=acc)
        return torch.minimum(torch.maximum(r, 1.0 / r_max), r_max), torch.minimum(torch.maximum(d, -d_max), d_max)
    return r.clamp(1.0 / r_max, r_max), d.clamp(-d_max, d_max)


def renormed_affine(w, b, r, d):
    """``(w * r, w * d + b)``: the weight and bias BatchNorm applies (``w``/``b`` None: 1 and 0),
    in the accumulation dtype of ``r``, differentiable in ``w`` and ``b``."""
    w_r = r if w is None else w.to(r.dtype) * r
    b_r = d if w is None else w.to(r.dtype) * d
    if b is not None:
        b_r = b_r + b.to(r.dtype)
    return w_r, b_r
