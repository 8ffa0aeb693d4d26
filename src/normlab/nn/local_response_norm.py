"""Local response normalization modules: drop-ins for ``torch.nn.LocalResponseNorm`` and
``torch.nn.CrossMapLRN2d``."""

from __future__ import annotations

import torch
from torch import nn

from .. import functional as F
from ..functional.local_response_norms import _check_arguments, cross_map_lrn2d
from ._base import _NotScriptable

__all__ = ["LocalResponseNorm", "CrossMapLRN2d"]


class _LRNBase(_NotScriptable, nn.Module):
    """What the two classes share: the four arguments, checked at construction (the messages name
    ``_who``), kept as attributes, and the ``repr``. Each class keeps its own ``__init__`` with
    its twin's signature: torch's defaults differ (``k=1.0`` and ``k=1``)."""

    __constants__ = ["size", "alpha", "beta", "k"]
    _who: str
    size: int
    alpha: float
    beta: float
    k: float

    def __init__(self, size: int, alpha: float, beta: float, k: float) -> None:
        _check_arguments(self._who, size, alpha, beta, k)
        super().__init__()
        self.size = size
        self.alpha = alpha
        self.beta = beta
        self.k = k

    def extra_repr(self) -> str:
        return f"{self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"


class LocalResponseNorm(_LRNBase):
    """Local response normalization across channels (dim 1), as in AlexNet:
    ``y = x / (k + alpha / size * sum_window x^2) ** beta``, the window the channels
    ``c - size // 2 .. c + (size - 1) // 2`` (zeros beyond the ends; always divided by ``size``).

    Twin: ``torch.nn.LocalResponseNorm`` -- same arguments, defaults, ``repr`` and values; no
    parameter or buffer (an empty ``state_dict``). normlab refuses ``size < 1`` or a ``size``
    that is not an int at construction (torch: at the first call).

    Shapes: input ``(N, C, *)`` with at least one trailing dim (3-D or more), output the same.

    Numerics: the squares, their window sums and the power in float32 for
    float16/bfloat16/float32 input and float64 for float64; the output is rounded once.

    >>> import torch, normlab
    >>> lrn = normlab.nn.LocalResponseNorm(2, alpha=2.0, beta=1.0, k=1.0)
    >>> lrn(torch.tensor([[[3.0], [4.0]]]))
    tensor([[[0.3000],
             [0.1538]]])
    """

    _who = "LocalResponseNorm"

    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0) -> None:
        super().__init__(size, alpha, beta, k)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.local_response_norm(input, self.size, self.alpha, self.beta, self.k)


class CrossMapLRN2d(_LRNBase):
    """Cross-map local response normalization of a 4-D input (Lua Torch's SpatialCrossMapLRN):
    ``y = x / (k + alpha / size * sum_window x^2) ** beta`` across channels.

    Twin: ``torch.nn.CrossMapLRN2d`` -- same arguments, defaults (``k=1``), ``repr`` and forward
    values, and so its window: with ``p = (size - 1) // 2 + 1``, the channels ``c - p + 1 ..
    c + p - 1`` (``size - 1`` of them for an even ``size``) *and channel 0 in every window*, as
    torch's running sum computes it (it never subtracts channel 0). The backward is the exact
    gradient of that forward; torch's hand-written backward assumes another window (it fails
    ``torch.autograd.gradcheck``), so gradients differ from torch's where the windows do. For
    the textbook window use :class:`LocalResponseNorm`. normlab refuses ``size < 1`` at
    construction with RuntimeError (torch: ZeroDivisionError for 0, and runs with a negative one).

    Shapes: input ``(N, C, H, W)``, output the same.

    Numerics: as :class:`LocalResponseNorm`.

    >>> import torch, normlab
    >>> normlab.nn.CrossMapLRN2d(3, alpha=3.0, beta=1.0, k=1)(torch.ones(1, 2, 1, 1))
    tensor([[[[0.3333]],
    <BLANKLINE>
             [[0.3333]]]])
    """

    _who = "CrossMapLRN2d"

    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1) -> None:
        super().__init__(size, alpha, beta, k)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return cross_map_lrn2d(input, self.size, self.alpha, self.beta, self.k)
