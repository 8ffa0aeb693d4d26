"""Shapes, strides and memory formats: how each family views its input and lays out its output.

The math (each family's ``reference.py``) works on canonical views -- rows ``(n_rows, n_cols)``,
channels ``(N, C, *)``, groups ``(N, G, Cg, S)``; the functions here make those views and give
the output the memory format torch gives it.
"""

from __future__ import annotations

import math

import torch

# --------------------------------------------------------------------------
# Views of the input
# --------------------------------------------------------------------------


def rows(x: torch.Tensor, normalized_shape: tuple) -> torch.Tensor:
    """``x`` as ``(n_rows, n_cols)``, ``n_cols`` the product of ``normalized_shape``."""
    n_cols = 1
    for s in normalized_shape:
        n_cols *= s
    if x.dim() == 2 and x.shape[1] == n_cols:
        return x  # already (n_rows, n_cols): no view node in the autograd graph
    return x.reshape(-1, n_cols)  # (n_rows, n_cols); copies only if it must


def flat(p: torch.Tensor | None) -> torch.Tensor | None:
    """A weight or bias as ``(n_cols,)``."""
    return p.reshape(-1) if p is not None and p.dim() != 1 else p


def like(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``t`` in ``x``'s shape (no view node when it already is)."""
    return t if t.shape == x.shape else t.reshape(x.shape)


def grouped(x: torch.Tensor, num_groups: int) -> torch.Tensor:
    """``(N, C, *)`` ``x`` as ``(N, G, Cg, S)``: ``G = num_groups`` groups of ``Cg`` channels of
    ``S`` = prod(spatial) values."""
    n, c = x.shape[0], x.shape[1]
    s = math.prod(x.shape[2:])
    return x.reshape(n, num_groups, c // num_groups, s)  # (N, G, Cg, S); copies only if it must


def group_params(t: torch.Tensor | None, num_groups: int) -> torch.Tensor | None:
    """A per-channel ``(C,)`` tensor as ``(G, Cg, 1)``, to broadcast against :func:`grouped`."""
    return None if t is None else t.reshape(num_groups, -1, 1)  # (G, Cg, 1)


# --------------------------------------------------------------------------
# Memory formats of the output
# --------------------------------------------------------------------------


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
    """``x.suggest_memory_format()``: the memory format torch gives the output of its CPU
    BatchNorm, GroupNorm and ``rms_norm`` (channels_last for a channels-last 4-D ``x``,
    channels_last_3d for 5-D, contiguous otherwise)."""
    if x.dim() == 4 and _channels_last_like(x.shape, x.stride(), (1, 3, 2, 0)):
        return torch.channels_last
    if x.dim() == 5 and _channels_last_like(x.shape, x.stride(), (1, 4, 3, 2, 0)):
        return torch.channels_last_3d
    return torch.contiguous_format


def canonical(x: torch.Tensor) -> torch.Tensor:
    """``x`` in the memory format of torch's output for it (a copy only if it is not already)."""
    if x.is_contiguous():
        return x
    return x.contiguous(memory_format=output_memory_format(x))


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


def rms_norm_layout(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``t`` in ``x``'s shape and in the memory format torch's ``rms_norm`` gives its output:
    ``x``'s suggested one (channels_last for a channels-last 4-D ``x``, channels_last_3d for
    5-D; a copy then), contiguous otherwise. (torch's LayerNorm output is always contiguous.)"""
    return like(t, x).contiguous(memory_format=output_memory_format(x))


def channels_as_rows(layer_norm, x, w, b, eps):
    """LayerNorm over dim 1 of ``x`` (N, C, *) by a row LayerNorm ``layer_norm(rows, (C,), w, b, eps)``
    on ``x.movedim(1, -1)`` (a channels_last ``x`` is already rows: no copy); the output in
    ``x``'s memory format."""
    rows_ = x.movedim(1, -1)  # (N, *, C)
    y = layer_norm(rows_, (x.shape[1],), w, b, eps)
    out = y.movedim(-1, 1)  # the input's strides when rows_ was contiguous
    return out if rows_.is_contiguous() else out.contiguous(memory_format=output_memory_format(x))


def empty_output(x: torch.Tensor, *params) -> torch.Tensor:
    """The (empty) output of a norm of an ``x`` with no value to normalise: 0 channels, or a
    ``normalized_shape`` with a 0 (or, for DyT, no row). Differentiable in ``x`` and in
    ``params``: their gradients are zeros of their own shape (empty tensors for empty
    parameters, as torch gives)."""
    y = x.contiguous().clone()
    for p in params:
        if p is not None:
            y = y + p.sum()  # added to no value: links p into the graph, its gradient 0
    return y
