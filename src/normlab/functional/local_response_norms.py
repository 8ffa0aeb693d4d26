"""Local response normalization as a function (``normlab.functional``; the math:
``normlab.ops.local_response_norm``)."""

from __future__ import annotations

import numbers

import torch

from .._backend import route
from .._checks import check_input
from ..ops.local_response_norm.reference import ref_local_response_norm


def local_response_norm(
    input: torch.Tensor,
    size: int,
    alpha: float = 1e-4,
    beta: float = 0.75,
    k: float = 1.0,
) -> torch.Tensor:
    """Local response normalization across channels (dim 1):
    ``y = x / (k + alpha / size * sum_window x^2) ** beta``, the window the channels
    ``c - size // 2 .. c + (size - 1) // 2`` (zeros beyond the ends; always divided by ``size``).

    Twin: ``torch.nn.functional.local_response_norm`` -- same signature, defaults and values.
    normlab refuses ``size < 1`` (torch's RuntimeError, from its pooling), a ``size`` that is not
    an int, and an integer input (``NotImplementedError``: convert it first) before any work.

    Shapes: input ``(N, C, *)`` with at least one trailing dim (3-D or more), output the same
    (contiguous).

    Numerics: the squares, their window sums and the power in float32 for
    float16/bfloat16/float32 input and float64 for float64; the output is rounded to the input's
    dtype once. No C++ kernel: every backend runs the reference (``normlab.backend_for`` says
    ``"ref"``).

    >>> import torch, normlab.functional as NF
    >>> NF.local_response_norm(torch.tensor([[[3.0], [4.0]]]), size=2, alpha=2.0, beta=1.0, k=1.0)
    tensor([[[0.3000],
             [0.1538]]])
    """
    fn = "local_response_norm"
    path = route(input, fn)
    check_input(fn, input)
    if input.dim() < 3:
        raise ValueError(
            f"{fn}: expected an input of 3 or more dims (N, C, *), got a {input.dim()}-D input of shape "
            f"{list(input.shape)}; give a batch and a trailing dim, e.g. x.reshape(1, C, -1)")
    size = _check_arguments(fn, size, alpha, beta, k)
    del path  # every path runs the reference (no kernel: ops/local_response_norm)
    return ref_local_response_norm(input, size, alpha, beta, k, "lrn")


def cross_map_lrn2d(input: torch.Tensor, size: int, alpha: float = 1e-4, beta: float = 0.75,
                    k: float = 1) -> torch.Tensor:
    """``normlab.nn.CrossMapLRN2d``'s computation (no torch.nn.functional twin; not exported):
    LRN of a 4-D ``(N, C, H, W)`` input with torch.nn.CrossMapLRN2d's window (see
    ``normlab.ops.local_response_norm.reference``)."""
    fn = "CrossMapLRN2d"
    path = route(input, "local_response_norm")
    check_input(fn, input)
    if input.dim() != 4:
        raise ValueError(
            f"{fn}: expected a 4-D input (N, C, H, W), got a {input.dim()}-D input of shape "
            f"{list(input.shape)}; use normlab.nn.LocalResponseNorm for other ranks")
    size = _check_arguments(fn, size, alpha, beta, k)
    del path  # every path runs the reference (no kernel: ops/local_response_norm)
    return ref_local_response_norm(input, size, alpha, beta, k, "cross_map")


def _check_arguments(fn: str, size, alpha, beta, k) -> int:
    """``size`` an int >= 1 (returned as an int); ``alpha``, ``beta``, ``k`` real numbers (any
    value: a negative ``k`` or ``alpha`` gives NaN where the base is negative, as torch)."""
    check_size(fn, size)
    for name, value in (("alpha", alpha), ("beta", beta), ("k", k)):
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            raise TypeError(f"{fn}: expected {name} to be a float, got {value!r} ({type(value).__name__})")
    return int(size)


def check_size(fn: str, size) -> None:
    """``size``: an int >= 1, the number of channel slots in the window (torch raises
    RuntimeError for 0 or less, TypeError for a non-int)."""
    if not isinstance(size, numbers.Integral) or isinstance(size, bool):
        raise TypeError(f"{fn}: expected size to be an int (the number of channels in the window), "
                        f"got {size!r} ({type(size).__name__})")
    if size < 1:
        raise RuntimeError(f"{fn}: expected size >= 1 (the number of channels in the window), got {size}; "
                           f"a window of 1 divides each value by (k + alpha * x^2)^beta")
