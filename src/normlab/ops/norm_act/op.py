"""The fused norm+act entries on the eager ``"cpu"`` path (``torch.ops.normlab.batch_norm_act_fwd``
/ ``_bwd``, ``group_norm_act_fwd`` / ``_bwd``, ``layer_norm_act_fwd`` / ``_bwd``: csrc/norm_act.cpp),
wired to autograd by :class:`BatchNormActFunction`, :class:`GroupNormActFunction` and
:class:`LayerNormActFunction`.

Each ``*_fused`` function takes the plain case only (a CPU tensor of a served dtype, parameters of
exactly the norm's shape, a float momentum in [0, 1], a non-negative eps, ...) and answers None for
anything else: the caller then runs the unfused composition, whose checks word the error.
``layer_norm_act2d_fused`` takes a channels_last input (its memory is rows of C values: the row ops) or
a contiguous (NCHW) one (``layer_norm_act2d_fwd`` / ``_bwd``, :class:`LayerNormAct2dFunction`).

Saved for the backward: x, weight, bias and the statistics (BatchNorm: (3, C) float64; GroupNorm:
mean and rstd (N, G); LayerNorm: mean and rstd per row) -- what the norm saves, plus the bias; the
backward recomputes the pre-activation z from them (docs/derivations/norm_act.md).
"""

from __future__ import annotations

import math
import numbers

import torch

from .. import extension

_C = extension.load()
_PLAIN = (torch.Tensor, torch.nn.Parameter)  # (a subclass with its own __torch_function__: not ours)
_SERVED = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _has_ops() -> bool:
    try:
        return _C is not None and hasattr(torch.ops.normlab, "batch_norm_act_fwd")
    except (AttributeError, RuntimeError):
        return False


HAS_FUSED = _has_ops()
# (group_norm_act_fwd is defined in the same file as batch_norm_act_fwd: both or neither)


class BatchNormActFunction(torch.autograd.Function):
    """``y = act(batch_norm(x))`` with the hand-derived backward (the C++ ops)."""

    @staticmethod
    def forward(ctx, x, w, b, rm, rv, training, momentum, eps, act, param):
        y, stats = torch.ops.normlab.batch_norm_act_fwd(x, w, b, rm, rv, training, momentum, eps, act, param)
        ctx.save_for_backward(x, w, b, stats)
        ctx.training, ctx.act, ctx.param = training, act, param
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, b, stats = ctx.saved_tensors
        need_dx, need_dw, need_db = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        dx, dw, db = torch.ops.normlab.batch_norm_act_bwd(dy, x, w, b, stats, ctx.training, ctx.act, ctx.param,
                                                          need_dx, need_dw and w is not None,
                                                          need_db and b is not None)
        return (dx if need_dx else None, dw if need_dw else None, db if need_db else None,
                None, None, None, None, None, None, None)


def _records(x, w, b) -> bool:
    """Whether autograd records this call: grad mode on and x, weight or bias requiring grad."""
    return torch.is_grad_enabled() and (x.requires_grad or (w is not None and w.requires_grad)
                                        or (b is not None and b.requires_grad))


def _chan(t, c: int) -> bool:
    return t is None or (type(t) in _PLAIN and t.is_cpu and t.dim() == 1 and t.shape[0] == c
                         and t.dtype in _SERVED)


def batch_norm_act_fused(x, rm, rv, w, b, training, momentum, eps, act: int, param: float):
    """``act(batch_norm(x, ...))`` by the fused ops, or None when the case is not theirs."""
    if not HAS_FUSED or type(x) is not torch.Tensor or x.dtype not in _SERVED or x.dim() < 2 or not x.is_cpu:
        return None
    c = x.shape[1]
    if x.numel() <= c or not (_chan(rm, c) and _chan(rv, c) and _chan(w, c) and _chan(b, c)):
        return None
    if (rm is None) != (rv is None) or (not training and rm is None) or type(training) is not bool:
        return None
    if (rm is not None and rm.requires_grad) or (rv is not None and rv.requires_grad):
        return None
    if not isinstance(momentum, numbers.Real) or isinstance(momentum, bool) or not 0 <= momentum <= 1:
        return None
    if not isinstance(eps, numbers.Real) or isinstance(eps, bool) or not eps > 0:
        return None
    args = (x, w, b, rm, rv, training, float(momentum), float(eps), act, float(param))
    if _records(x, w, b):
        return BatchNormActFunction.apply(*args)
    return torch.ops.normlab.batch_norm_act_fwd(*args)[0]


class GroupNormActFunction(torch.autograd.Function):
    """``y = act(group_norm(x))`` with the hand-derived backward (the C++ ops)."""

    @staticmethod
    def forward(ctx, x, g, w, b, eps, act, param):
        y, mean, rstd = torch.ops.normlab.group_norm_act_fwd(x, w, b, g, eps, act, param)
        ctx.save_for_backward(x, w, b, mean, rstd)
        ctx.g, ctx.act, ctx.param = g, act, param
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, b, mean, rstd = ctx.saved_tensors
        dx, dw, db = torch.ops.normlab.group_norm_act_bwd(dy, x, w, b, mean, rstd, ctx.g, ctx.act, ctx.param,
                                                          ctx.needs_input_grad[0])
        return (dx if ctx.needs_input_grad[0] else None, None,
                dw.to(w.dtype) if ctx.needs_input_grad[2] else None,
                db.to(b.dtype) if ctx.needs_input_grad[3] else None, None, None, None)


def _params_fit(x, *params) -> bool:
    """Per-channel parameters GroupNorm's kernels take beside x: x's dtype, or float32 beside half."""
    return all(p is None or p.dtype == x.dtype or (p.dtype == torch.float32 and x.dtype in _HALF) for p in params)


_HALF = (torch.bfloat16, torch.float16)


def group_norm_act_fused(x, g, w, b, eps, act: int, param: float):
    """``act(group_norm(x, g, w, b, eps))`` by the fused ops, or None when the case is not theirs."""
    if not HAS_FUSED or type(x) not in _PLAIN or x.dtype not in _SERVED or x.dim() < 2 or not x.is_cpu:
        return None
    c = x.shape[1]
    if type(g) is not int or g <= 0 or c % g or x.numel() == 0 or x.numel() // (x.shape[0] * g) < 2:
        return None
    if not (_chan(w, c) and _chan(b, c) and _params_fit(x, w, b)):
        return None
    if not isinstance(eps, numbers.Real) or isinstance(eps, bool) or not eps >= 0:
        return None
    args = (x, g, w, b, float(eps), act, float(param))
    if _records(x, w, b):
        return GroupNormActFunction.apply(*args)
    return torch.ops.normlab.group_norm_act_fwd(x, w, b, g, float(eps), act, float(param))[0]


class LayerNormActFunction(torch.autograd.Function):
    """``y = act(layer_norm(x))`` over rows of ``n_cols`` values with the hand-derived backward (the C++ ops)."""

    @staticmethod
    def forward(ctx, x, n_cols, w, b, eps, act, param):
        wf = None if w is None else w.reshape(-1)
        bf = None if b is None else b.reshape(-1)
        y, mean, rstd = torch.ops.normlab.layer_norm_act_fwd(x, n_cols, wf, bf, eps, act, param)
        ctx.save_for_backward(x, wf, bf, mean, rstd)
        ctx.n_cols, ctx.act, ctx.param = n_cols, act, param
        ctx.shapes = (None if w is None else (w.shape, w.dtype), None if b is None else (b.shape, b.dtype))
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, b, mean, rstd = ctx.saved_tensors
        need_dwb = ctx.needs_input_grad[2] or ctx.needs_input_grad[3]
        dx, dw, db = torch.ops.normlab.layer_norm_act_bwd(dy, x, w, b, mean, rstd, ctx.n_cols, ctx.act, ctx.param,
                                                          need_dwb)
        (ws, wt), (bs, bt) = (s if s is not None else (None, None) for s in ctx.shapes)
        return (dx if ctx.needs_input_grad[0] else None, None,
                dw.reshape(ws).to(wt) if ctx.needs_input_grad[2] else None,
                db.reshape(bs).to(bt) if ctx.needs_input_grad[3] else None, None, None, None)


def _row_params_fit(x, shape, w, b) -> bool:
    """weight and bias of exactly ``shape``, both or a weight alone, one dtype: x's, or float32 beside half."""
    if w is None and b is not None:
        return False
    for p in (w, b):
        if p is not None and not (type(p) in _PLAIN and p.is_cpu and tuple(p.shape) == shape
                                  and (p.dtype == x.dtype or (p.dtype == torch.float32 and x.dtype in _HALF))):
            return False
    return w is None or b is None or w.dtype == b.dtype


def _layer_norm_act_rows(x, n_cols, shape, w, b, eps, act, param):
    if not (isinstance(eps, numbers.Real) and not isinstance(eps, bool) and eps >= 0) or not _row_params_fit(
            x, shape, w, b):
        return None
    args = (x, n_cols, w, b, float(eps), act, float(param))
    if _records(x, w, b):
        return LayerNormActFunction.apply(*args)
    return torch.ops.normlab.layer_norm_act_fwd(x, n_cols, None if w is None else w.reshape(-1),
                                                None if b is None else b.reshape(-1), float(eps), act, float(param))[0]


def layer_norm_act_fused(x, normalized_shape, w, b, eps, act: int, param: float):
    """``act(layer_norm(x, normalized_shape, w, b, eps))`` by the fused ops, or None when the case is not theirs."""
    if not HAS_FUSED or type(x) not in _PLAIN or x.dtype not in _SERVED or not x.is_cpu or x.numel() == 0:
        return None
    shape = (normalized_shape,) if type(normalized_shape) is int else normalized_shape
    if not isinstance(shape, (tuple, list, torch.Size)) or not shape or any(type(s) is not int for s in shape):
        return None
    shape = tuple(shape)
    if x.dim() < len(shape) or tuple(x.shape[x.dim() - len(shape):]) != shape or math.prod(shape) <= 0:
        return None
    return _layer_norm_act_rows(x.contiguous(), math.prod(shape), shape, w, b, eps, act, param)


class LayerNormAct2dFunction(torch.autograd.Function):
    """``y = act(layer_norm2d(x))`` on a contiguous (NCHW) x with the hand-derived backward (the C++ ops
    ``layer_norm_act2d_fwd`` / ``_bwd``: LayerNorm2d's NCHW kernels, the activation in their passes)."""

    @staticmethod
    def forward(ctx, x, w, b, eps, act, param):
        y, mean, rstd = torch.ops.normlab.layer_norm_act2d_fwd(x, w, b, eps, act, param)
        ctx.save_for_backward(x, w, b, mean, rstd)
        ctx.act, ctx.param = act, param
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, b, mean, rstd = ctx.saved_tensors
        need_dwb = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
        dx, dw, db = torch.ops.normlab.layer_norm_act2d_bwd(dy, x, w, b, mean, rstd, ctx.act, ctx.param, need_dwb)
        return (dx if ctx.needs_input_grad[0] else None,
                dw.to(w.dtype) if ctx.needs_input_grad[1] else None,
                db.to(b.dtype) if ctx.needs_input_grad[2] else None, None, None, None)


def _layer_norm_act2d_nchw(x, w, b, eps, act, param):
    c = x.shape[1]
    if not (isinstance(eps, numbers.Real) and not isinstance(eps, bool) and eps >= 0) or not _row_params_fit(
            x, (c,), w, b):
        return None
    args = (x, w, b, float(eps), act, float(param))
    if _records(x, w, b):
        return LayerNormAct2dFunction.apply(*args)
    return torch.ops.normlab.layer_norm_act2d_fwd(*args)[0]


def layer_norm_act2d_fused(x, w, b, eps, act: int, param: float):
    """``act(layer_norm2d(x, w, b, eps))`` for an (N, C, H, W) x: channels_last (its memory: rows of C
    values) by the row ops, contiguous (NCHW) by ``layer_norm_act2d_fwd``; None for any other layout."""
    if not HAS_FUSED or type(x) not in _PLAIN or x.dtype not in _SERVED or not x.is_cpu or x.dim() != 4:
        return None
    c = x.shape[1]
    if x.numel() == 0 or c <= 0:
        return None
    rows_of_c = x.is_contiguous(memory_format=torch.channels_last) and (
        not x.is_contiguous() or x.shape[2] * x.shape[3] == 1)
    if rows_of_c:
        return _layer_norm_act_rows(x, c, (c,), w, b, eps, act, param)
    if x.is_contiguous():
        return _layer_norm_act2d_nchw(x, w, b, eps, act, param)
    return None
