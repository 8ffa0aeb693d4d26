"""BatchNorm reference (backend ``"ref"``): the math, its hand-derived backward, running statistics, the autograd wiring.

BatchNorm normalises each *channel* of an ``(N, C, *spatial)`` input with
statistics taken over the batch dim and every spatial dim together: for a
channel ``c`` the ``n = N * prod(spatial)`` values ``x[:, c, ...]`` share one
mean and one variance. Unlike LayerNorm, the output of a sample therefore
depends on the rest of its batch while training.

Training mode (batch statistics)::

    mean  = sum(x) / n                         # (1, C, 1, ...)  per channel
    var   = sum((x - mean)^2) / n              # (1, C, 1, ...)  biased
    rstd  = 1 / sqrt(var + eps)                # (1, C, 1, ...)
    x_hat = (x - mean) * rstd                  # (N, C, *spatial)
    y     = x_hat * w[c] + b[c]                # (N, C, *spatial)

and, when running statistics are kept, in place and outside autograd::

    running_mean = (1 - momentum) * running_mean + momentum * mean
    running_var  = (1 - momentum) * running_var  + momentum * var * n / (n - 1)

The running variance takes the *unbiased* variance (``n / (n - 1)``, Bessel's
correction) because it estimates the population variance used at inference;
the normalisation itself uses the biased one, as ``torch.nn.BatchNorm*d``
does. ``momentum`` is the weight of the new batch statistic; the caller
(``normlab.nn``) turns ``momentum=None`` into the cumulative-average factor
``1 / num_batches_tracked`` before calling in.

Evaluation mode (running statistics, a per-channel affine map of ``x``)::

    rstd = 1 / sqrt(running_var + eps)
    y    = (x - running_mean) * rstd * w[c] + b[c]

Numerics: statistics and every sum are computed in float32 for
float16/bfloat16/float32 input and in float64 for float64 input; the output is
cast to the input's dtype once, at the end. The per-channel mean and variance
come from the shifted two-pass algorithm (``ops/numerics.shifted_mean_var``),
never from ``E[x^2] - E[x]^2``, so float32 channels with a mean far from zero
(1e4 against a spread of 1) keep their digits; one refinement pass then moves
the residual mean of the centred values into the mean (see ``_mean_var_xc``).
Per-channel sums (statistics' refinement, ``dw``, ``db``, the backward's means)
reduce the spatial dims first and then N. Mixed precision follows torch:
float16/bfloat16 input may come with float32 ``w``/``b``/running statistics;
``dw``/``db`` are returned in the parameter's dtype, and the running
statistics are updated in their own dtype (the blend is formed in the
accumulation dtype and rounded once when written back).

Memory format: the output has the layout torch's ``batch_norm`` gives it --
``channels_last`` (``channels_last_3d``) when the input's strides are those of
a channels-last tensor, the contiguous layout otherwise.

The derivation of the backward is in ``docs/derivations/batch_norm.md``.
"""

from __future__ import annotations

import torch

from .. import _transforms
from ..forward_mode import affine_jvp, x_hat_jvp
from ..layouts import empty_output, output_memory_format
from ..numerics import acc_dtype, shifted_mean_var

# --------------------------------------------------------------------------
# The per-channel view: statistics over every dim but the channel dim 1
# --------------------------------------------------------------------------


def _reduce_dims(x: torch.Tensor) -> tuple[int, ...]:
    """Every dim but the channel dim 1: ``(0, 2, 3, ...)``."""
    return (0, *range(2, x.dim()))


def _stat_shape(x: torch.Tensor) -> tuple[int, ...]:
    """``(1, C, 1, ...)``: a per-channel vector shaped to broadcast against ``x``."""
    return (1, x.shape[1]) + (1,) * (x.dim() - 2)


def _per_channel(t: torch.Tensor | None, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """A ``(C,)`` tensor as ``(1, C, 1, ...)`` in ``dtype`` (None stays None)."""
    if t is None:
        return None
    return t.to(dtype).reshape(_stat_shape(x))


def _channel_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over N and every spatial dim, kept as ``(1, C, 1, ...)``.

    In two stages, the spatial dims first and then N: measured on float32
    NCHW tensors this is ~2x more accurate than one ``sum(dim=(0, 2, 3))``,
    which matters for ``db`` and ``dw`` (sums of up to 1e6 values per channel).
    """
    if t.dim() > 2:
        t = t.sum(dim=tuple(range(2, t.dim())), keepdim=True)  # (N, C, 1, ...)
    return t.sum(dim=0, keepdim=True)  # (1, C, 1, ...)


def _channel_mean(t: torch.Tensor) -> torch.Tensor:
    """Mean over N and every spatial dim, kept as ``(1, C, 1, ...)``."""
    return _channel_sum(t) / (t.numel() // t.shape[1])


# --------------------------------------------------------------------------
# Reference forward: the formula in plain torch ops, in the accumulation dtype
# --------------------------------------------------------------------------


def _mean_var_xc(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-channel mean, biased variance and centred values of ``x`` (accumulation dtype).

    ``shifted_mean_var`` shifts each channel by its first element. A channel
    holds many values (``N * prod(spatial)``, often 1e4..1e6), and when the
    first one lies a few standard deviations from the mean, the float32 sum
    of the shifted values carries an error of ~1e-7 of *that* distance into
    the mean (measured: 7e-7 for a 65536-value channel, 7x torch's). The mean
    matters beyond ``y``: ``dw`` moves by ``rstd * sum(dy)`` per unit of error
    in it. So one refinement pass follows: the centred values' own mean
    (ideally 0, small and accurately summed) is the residual error, and is
    moved from ``xc`` into ``mean``. A constant channel still gives ``xc == 0``
    exactly. The variance changes only by ``residual^2`` and is kept.

    A channel holding an infinity gets a NaN mean from the shift (``inf - inf``);
    there the mean is torch's ``sum / count`` (``+-inf``, or NaN with a NaN or both
    signs), as the running mean then is in torch.nn (the "cpu" kernels do the same).
    """
    dims = _reduce_dims(x)
    mean, var, xc = shifted_mean_var(x, dim=dims)  # (1, C, 1, ...) x2, (N, C, *spatial)
    residual = _channel_mean(xc)  # (1, C, 1, ...)
    mean = mean + residual
    return torch.where(mean.isnan(), _channel_mean(x), mean), var, xc - residual


def batch_norm_stats(
    x: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-channel ``mean``, biased ``var`` and ``rstd`` of ``x`` (already in its accumulation dtype).

    All three have shape ``(1, C, 1, ...)``. Differentiable, so the double
    backward can recompute them as functions of ``x``.
    """
    mean, var, _ = _mean_var_xc(x)  # (1, C, 1, ...) each
    rstd = torch.rsqrt(var + eps)  # (1, C, 1, ...)
    return mean, var, rstd


def batch_norm_train_ref(
    x: torch.Tensor,
    w: torch.Tensor | None,
    b: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """BatchNorm with the batch's statistics; returns ``(y, mean, rstd, mean_c, var_c)``.

    ``y`` has ``x``'s dtype and torch's memory format. ``mean`` and ``rstd``
    (1, C, 1, ...) are what the backward needs besides ``x``; ``mean_c`` and
    ``var_c`` (C,) are the per-channel mean and *biased* variance the running
    statistics are updated from. All statistics are in the accumulation dtype.
    """
    acc = acc_dtype(x.dtype)
    xa = x.to(acc)  # (N, C, *spatial)
    mean, var, xc = _mean_var_xc(xa)  # (1, C, 1, ...) x2, (N, C, *spatial)
    rstd = torch.rsqrt(var + eps)  # (1, C, 1, ...)
    x_hat = xc * rstd  # (N, C, *spatial)
    y = x_hat
    if w is not None:
        y = y * _per_channel(w, x, acc)  # (N, C, *spatial)
    # no bias: + 0 as torch (x * alpha + (0 - mean * alpha)): a zero product is +0, not -0
    y = y + (_per_channel(b, x, acc) if b is not None else 0.0)  # (N, C, *spatial)
    y = y.to(x.dtype).contiguous(memory_format=output_memory_format(x))
    return y, mean, rstd, mean.reshape(-1), var.reshape(-1)


def batch_norm_eval_ref(
    x: torch.Tensor,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    w: torch.Tensor | None,
    b: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """BatchNorm with the running statistics; returns ``(y, mean, rstd)``.

    ``y = (x - running_mean) * rsqrt(running_var + eps) * w + b``, a fixed
    per-channel affine map: no value of another sample is read. ``mean`` and
    ``rstd`` (1, C, 1, ...) are the running statistics in the accumulation dtype.
    """
    acc = acc_dtype(x.dtype)
    mean = _per_channel(running_mean, x, acc)  # (1, C, 1, ...)
    rstd = torch.rsqrt(_per_channel(running_var, x, acc) + eps)  # (1, C, 1, ...)
    y = (x.to(acc) - mean) * rstd  # x_hat, (N, C, *spatial)
    if w is not None:
        y = y * _per_channel(w, x, acc)
    y = y + (_per_channel(b, x, acc) if b is not None else 0.0)  # no bias: + 0, as torch (see the training's)
    y = y.to(x.dtype).contiguous(memory_format=output_memory_format(x))
    return y, mean, rstd


@torch.no_grad()
def update_running_stats(
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    mean_c: torch.Tensor,
    var_c: torch.Tensor,
    n: int,
    momentum: float,
) -> None:
    """Blend the batch statistics into the running ones, in place, outside autograd.

    ``running = (1 - momentum) * running + momentum * batch_stat``, with the
    batch variance made unbiased first (``var_c * n / (n - 1)``, ``n`` values
    per channel). Formed in the accumulation dtype of the statistics, written
    back in each buffer's own dtype (one rounding).
    """
    acc = mean_c.dtype
    unbiased_var_c = var_c * n / (n - 1)  # (C,)  Bessel's correction
    new_mean = (1.0 - momentum) * running_mean.to(acc) + momentum * mean_c  # (C,)
    new_var = (1.0 - momentum) * running_var.to(acc) + momentum * unbiased_var_c  # (C,)
    running_mean.copy_(new_mean)
    running_var.copy_(new_var)


# --------------------------------------------------------------------------
# Analytic backward (see docs/derivations/batch_norm.md)
# --------------------------------------------------------------------------


def batch_norm_train_backward_ref(
    dy: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor | None,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    need_dx: bool = True,
    need_dw: bool = True,
    need_db: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Gradients of training-mode BatchNorm; returns ``(dx, dw, db)``.

    ``mean_c`` below is a mean over N and every spatial dim, per channel. With
    ``g = dy * w[c]`` (the gradient arriving at ``x_hat``)::

        dx = rstd * ( g                                # term 1: through x directly
                      - mean_c(g)                      # term 2: through the batch mean
                      - x_hat * mean_c(g * x_hat) )    # term 3: through the batch variance
        dw = sum over N and spatial of dy * x_hat      # (C,)
        db = sum over N and spatial of dy              # (C,)

    Written in differentiable torch ops, so it has a backward of its own
    (double backward) when run under ``create_graph=True``. ``dw`` is cast to
    ``w``'s dtype; ``db`` is left in the accumulation dtype for the caller.
    """
    acc = mean.dtype
    dya = dy.to(acc)  # (N, C, *spatial)
    x_hat = (x.to(acc) - mean) * rstd  # (N, C, *spatial)
    dx = dw = db = None
    if need_dx:
        g = dya * _per_channel(w, x, acc) if w is not None else dya  # (N, C, *spatial)
        term1 = g
        term2 = _channel_mean(g)  # (1, C, 1, ...)
        term3 = x_hat * _channel_mean(g * x_hat)  # (N, C, *spatial)
        dx = (rstd * (term1 - term2 - term3)).to(x.dtype)
        dx = dx.contiguous(memory_format=output_memory_format(x))
    if need_dw and w is not None:
        dw = _channel_sum(dya * x_hat).reshape(-1).to(w.dtype)  # (C,)
    if need_db:
        db = _channel_sum(dya).reshape(-1)  # (C,)
    return dx, dw, db


def batch_norm_eval_backward_ref(
    dy: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor | None,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    need_dx: bool = True,
    need_dw: bool = True,
    need_db: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Gradients of evaluation-mode BatchNorm; returns ``(dx, dw, db)``.

    The running statistics are constants, so ``y`` is linear in ``x``::

        dx = dy * w[c] * rstd                          # (N, C, *spatial)
        dw = sum over N and spatial of dy * x_hat      # x_hat = (x - running_mean) * rstd
        db = sum over N and spatial of dy

    No gradient flows to the running statistics.
    """
    acc = mean.dtype
    dya = dy.to(acc)  # (N, C, *spatial)
    dx = dw = db = None
    if need_dx:
        scale = rstd * _per_channel(w, x, acc) if w is not None else rstd  # (1, C, 1, ...)
        dx = (dya * scale).to(x.dtype).contiguous(memory_format=output_memory_format(x))
    if need_dw and w is not None:
        x_hat = (x.to(acc) - mean) * rstd  # (N, C, *spatial)
        dw = _channel_sum(dya * x_hat).reshape(-1).to(w.dtype)  # (C,)
    if need_db:
        db = _channel_sum(dya).reshape(-1)  # (C,)
    return dx, dw, db


# --------------------------------------------------------------------------
# Autograd wiring
# --------------------------------------------------------------------------


def batch_norm_jvp(x, w, mean, rstd, xt, wt, bt, training):
    """Tangent of BatchNorm's ``y`` along tangents of ``x``, ``w``, ``b`` (each may be None).

    ``mean``/``rstd`` (1, C, 1, ...): the forward's statistics (the batch's in
    training, where they move with ``x``: ``ops/forward_mode.x_hat_jvp`` over every dim
    but the channels; the running ones in evaluation, constants: ``d x_hat = rstd * t``).
    """
    acc = acc_dtype(x.dtype)
    x_hat = (x.to(acc) - mean) * rstd  # (N, C, *spatial)
    dx_hat = None
    if xt is not None:
        t = xt.to(acc)
        dx_hat = x_hat_jvp(x_hat, rstd, t, _reduce_dims(x), True) if training else rstd * t
    yt = affine_jvp(x_hat, dx_hat, _per_channel(w, x, acc), _per_channel(wt, x, acc), _per_channel(bt, x, acc))
    return None if yt is None else yt.to(x.dtype)


class BatchNormTrainFunction(torch.autograd.Function):
    """Training-mode BatchNorm with the hand-derived backward and forward-mode rule.

    Returns ``(y, mean_c, var_c)``; the per-channel statistics are marked
    non-differentiable (they only feed the running-statistic update). Saves
    ``x``, ``w``, ``mean`` and ``rstd`` (from ``mean_c``, ``var_c``). Under
    ``create_graph=True`` the backward recomputes ``mean``/``rstd`` from ``x``
    with differentiable ops, so the second derivative sees how the batch
    statistics depend on ``x``. Torch ops throughout: torch.func's vmap batches it
    as it is (``generate_vmap_rule``).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(x, w, b, eps):
        y, _, _, mean_c, var_c = batch_norm_train_ref(x, w, b, eps)
        return y, mean_c, var_c

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w, b, eps = inputs
        _, mean_c, var_c = output
        shape = _stat_shape(x)
        mean, rstd = mean_c.reshape(shape), torch.rsqrt(var_c.reshape(shape) + eps)  # as the forward's
        ctx.save_for_backward(x, w, mean, rstd)
        ctx.save_for_forward(x, w, mean, rstd)
        ctx.eps = eps
        ctx.b_dtype = b.dtype if b is not None else None
        ctx.mark_non_differentiable(mean_c, var_c)

    @staticmethod
    def backward(ctx, dy, _dmean_c, _dvar_c):
        x, w, mean, rstd = ctx.saved_tensors
        if _transforms.differentiable_backward():  # double backward: statistics as functions of x
            mean, _, rstd = batch_norm_stats(x.to(acc_dtype(x.dtype)), ctx.eps)
        need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
        dx, dw, db = batch_norm_train_backward_ref(dy, x, w, mean, rstd, need_dx, need_dw, need_db)
        if db is not None:
            db = db.to(ctx.b_dtype)
        return dx, dw, db, None

    @staticmethod
    def _jvp(ctx, xt, wt, bt, _eps_t):
        x, w, mean, rstd = ctx.saved_tensors
        return batch_norm_jvp(x, w, mean, rstd, xt, wt, bt, True), None, None


class BatchNormEvalFunction(torch.autograd.Function):
    """Evaluation-mode BatchNorm (running statistics) with the hand-derived backward and
    forward-mode rule.

    Saves ``x``, ``w`` and the running ``mean``/``rstd``; these do not depend
    on ``x``, so the backward (written in differentiable ops) is already its
    own correct double backward. No gradient for the running statistics.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(x, running_mean, running_var, w, b, eps):
        return batch_norm_eval_ref(x, running_mean, running_var, w, b, eps)[0]

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, running_mean, running_var, w, b, eps = inputs
        acc = acc_dtype(x.dtype)
        mean = _per_channel(running_mean, x, acc)  # (1, C, 1, ...), as the forward's
        rstd = torch.rsqrt(_per_channel(running_var, x, acc) + eps)
        ctx.save_for_backward(x, w, mean, rstd)
        ctx.save_for_forward(x, w, mean, rstd)
        ctx.b_dtype = b.dtype if b is not None else None

    @staticmethod
    def backward(ctx, dy):
        x, w, mean, rstd = ctx.saved_tensors
        need_dx, _, _, need_dw, need_db = ctx.needs_input_grad[:5]
        dx, dw, db = batch_norm_eval_backward_ref(dy, x, w, mean, rstd, need_dx, need_dw, need_db)
        if db is not None:
            db = db.to(ctx.b_dtype)
        return dx, None, None, dw, db, None

    @staticmethod
    def _jvp(ctx, xt, _rmt, _rvt, wt, bt, _eps_t):
        x, w, mean, rstd = ctx.saved_tensors
        return batch_norm_jvp(x, w, mean, rstd, xt, wt, bt, False)


# --------------------------------------------------------------------------
# The REF path (what normlab.functional runs when normlab._backend.route says REF;
# normlab.functional has checked the arguments)
# --------------------------------------------------------------------------


def check_batched_buffers(x, running_mean, running_var) -> None:
    """Under vmap, the running statistics an update writes must be batched where the input is
    (one pair per batch member), as torch requires."""
    is_batched = torch._C._functorch.is_batchedtensor
    if is_batched(x) and not (is_batched(running_mean) and is_batched(running_var)):
        raise RuntimeError(
            "batch_norm: got a batched tensor as input while the running_mean or running_var, which "
            "will be updated in place, were not batched; use track_running_stats=False, batched "
            "buffers (torch.func.stack_module_state), or eval mode"
        )


def ref_batch_norm(x, running_mean, running_var, w, b, training, momentum, eps):
    """BatchNorm of an ``(N, C, *spatial)`` ``x`` by :func:`batch_norm_ref` (empty in, empty out)."""
    if x.numel() == 0 and not training and running_mean is None:
        return empty_output(x, w, b)
    if training and running_mean is not None and _transforms.active():
        check_batched_buffers(x, running_mean, running_var)
    return batch_norm_ref(x, running_mean, running_var, w, b, training, momentum, eps)


def batch_norm_ref(x, running_mean, running_var, w, b, training, momentum, eps):
    """BatchNorm of an ``(N, C, *spatial)`` ``x`` by the reference math (arguments already checked).

    ``training=True``: normalise with the batch's statistics and, when
    ``running_mean``/``running_var`` are given, update them in place with
    weight ``momentum`` (unbiased variance). ``training=False``: normalise with
    the running statistics, which are left untouched.
    """
    if not training:
        return _transforms.pick(BatchNormEvalFunction).apply(x, running_mean, running_var, w, b, eps)
    if x.numel() == 0:
        # An empty batch (torch accepts it in training): an empty output, zero
        # dw/db, running statistics untouched. Any statistics would do; 0 and 1.
        stat = torch.zeros(x.shape[1], dtype=acc_dtype(x.dtype), device=x.device)
        return _transforms.pick(BatchNormEvalFunction).apply(x, stat, stat + 1, w, b, eps)
    y, mean_c, var_c = _transforms.pick(BatchNormTrainFunction).apply(x, w, b, eps)
    if running_mean is not None:
        n = x.numel() // x.shape[1]  # values per channel
        update_running_stats(running_mean, running_var, mean_c, var_c, n, momentum)
    return y
