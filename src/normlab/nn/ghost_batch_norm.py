"""Ghost BatchNorm modules (Hoffer et al., 2017): ``GhostBatchNorm1d`` / ``2d`` / ``3d``.

BatchNorm whose training statistics come from virtual batches of
``virtual_batch_size`` consecutive samples, each normalised with its own
statistics (the last virtual batch holds what is left). BatchNorm's parameters,
buffers and ``state_dict`` keys; the running statistics take one update per
virtual batch, in order, so ``num_batches_tracked`` counts virtual batches. The
math is in ``normlab.functional.ghost_batch_norm`` (``ops/batch_norm/ghost.py``).
"""

from __future__ import annotations

import torch

from .. import functional as F
from ..functional.checks import check_virtual_batch_size
from ._base import _NormBase

__all__ = ["GhostBatchNorm1d", "GhostBatchNorm2d", "GhostBatchNorm3d"]


class _GhostBatchNorm(_NormBase):
    """Shared body of ``GhostBatchNorm1d/2d/3d``: BatchNorm's arguments after ``virtual_batch_size``."""

    def __init__(
        self,
        num_features: int,
        virtual_batch_size: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device=None,
        dtype=None,
        *,
        bias: bool = True,
    ) -> None:
        check_virtual_batch_size(type(self).__name__, virtual_batch_size)
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype, bias=bias)
        self.virtual_batch_size = int(virtual_batch_size)

    def _check_input_dim(self, input: torch.Tensor) -> None:
        raise NotImplementedError

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if self.affine or self.track_running_stats:
            self._check_num_channels(input)
        tracking = self.training and self.track_running_stats
        use_batch_stats = self.training or not self.track_running_stats
        count = self.num_batches_tracked
        y = F.ghost_batch_norm(
            input, self.virtual_batch_size,
            self.running_mean if (tracking or not self.training) else None,
            self.running_var if (tracking or not self.training) else None,
            self.weight, self.bias, use_batch_stats, self.momentum, self.eps,
            num_batches_tracked=count if tracking else None,
        )
        if tracking:  # one update per virtual batch
            count.add_(-(-input.shape[0] // self.virtual_batch_size))
        return y

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, virtual_batch_size={self.virtual_batch_size}"


class GhostBatchNorm1d(_GhostBatchNorm):
    """Ghost BatchNorm (Hoffer et al., 2017) of an ``(N, C)`` or ``(N, C, L)`` input: BatchNorm with the statistics of
    each virtual batch of ``virtual_batch_size`` consecutive samples,
    ``y = (x - mean_v) / sqrt(var_v + eps) * weight + bias``.

    No torch.nn twin: ``torch.nn.BatchNorm1d``'s arguments with ``virtual_batch_size`` after
    ``num_features``, and its parameters, buffers and ``state_dict`` keys. In training it equals
    ``BatchNorm1d`` applied to ``x.split(virtual_batch_size)`` one chunk after the other (the last chunk
    holds what is left), in one kernel call; eval is BatchNorm's eval.

    Shapes: input ``(N, C)`` or ``(N, C, L)``, output the same; per-channel tensors ``(C,)``.

    Numerics: as BatchNorm, per virtual batch (statistics in float32 for float16/bfloat16/float32
    input, float64 for float64; biased variance to normalise, unbiased into ``running_var``); the
    running statistics take one ``momentum`` update per virtual batch, in order, so
    ``num_batches_tracked`` counts virtual batches (``momentum=None``: their cumulative average).

    >>> import torch, normlab
    >>> gbn = normlab.nn.GhostBatchNorm1d(3, virtual_batch_size=4)
    >>> gbn(torch.randn(10, 3)).shape, int(gbn.num_batches_tracked)  # virtual batches of 4, 4, 2
    (torch.Size([10, 3]), 3)
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() != 2 and input.dim() != 3:
            raise ValueError(f"expected 2D or 3D input (got {input.dim()}D input)")


class GhostBatchNorm2d(_GhostBatchNorm):
    """Ghost BatchNorm (Hoffer et al., 2017) of an ``(N, C, H, W)`` input: BatchNorm with the statistics of
    each virtual batch of ``virtual_batch_size`` consecutive samples,
    ``y = (x - mean_v) / sqrt(var_v + eps) * weight + bias``.

    No torch.nn twin: ``torch.nn.BatchNorm2d``'s arguments with ``virtual_batch_size`` after
    ``num_features``, and its parameters, buffers and ``state_dict`` keys. In training it equals
    ``BatchNorm2d`` applied to ``x.split(virtual_batch_size)`` one chunk after the other (the last chunk
    holds what is left), in one kernel call; eval is BatchNorm's eval.

    Shapes: input ``(N, C, H, W)``, output the same; per-channel tensors ``(C,)``.

    Numerics: as BatchNorm, per virtual batch (statistics in float32 for float16/bfloat16/float32
    input, float64 for float64; biased variance to normalise, unbiased into ``running_var``); the
    running statistics take one ``momentum`` update per virtual batch, in order, so
    ``num_batches_tracked`` counts virtual batches (``momentum=None``: their cumulative average).

    >>> import torch, normlab
    >>> gbn = normlab.nn.GhostBatchNorm2d(2, virtual_batch_size=2)
    >>> x = torch.randn(4, 2, 3, 3)
    >>> chunks = [torch.nn.functional.batch_norm(c, None, None, training=True) for c in x.split(2)]
    >>> torch.allclose(gbn(x), torch.cat(chunks), atol=1e-6), int(gbn.num_batches_tracked)
    (True, 2)
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() != 4:
            raise ValueError(f"expected 4D input (got {input.dim()}D input)")


class GhostBatchNorm3d(_GhostBatchNorm):
    """Ghost BatchNorm (Hoffer et al., 2017) of an ``(N, C, D, H, W)`` input: BatchNorm with the statistics of
    each virtual batch of ``virtual_batch_size`` consecutive samples,
    ``y = (x - mean_v) / sqrt(var_v + eps) * weight + bias``.

    No torch.nn twin: ``torch.nn.BatchNorm3d``'s arguments with ``virtual_batch_size`` after
    ``num_features``, and its parameters, buffers and ``state_dict`` keys. In training it equals
    ``BatchNorm3d`` applied to ``x.split(virtual_batch_size)`` one chunk after the other (the last chunk
    holds what is left), in one kernel call; eval is BatchNorm's eval.

    Shapes: input ``(N, C, D, H, W)``, output the same; per-channel tensors ``(C,)``.

    Numerics: as BatchNorm, per virtual batch (statistics in float32 for float16/bfloat16/float32
    input, float64 for float64; biased variance to normalise, unbiased into ``running_var``); the
    running statistics take one ``momentum`` update per virtual batch, in order, so
    ``num_batches_tracked`` counts virtual batches (``momentum=None``: their cumulative average).

    >>> import torch, normlab
    >>> normlab.nn.GhostBatchNorm3d(2, virtual_batch_size=3)(torch.randn(5, 2, 2, 2, 2)).shape
    torch.Size([5, 2, 2, 2, 2])
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() != 5:
            raise ValueError(f"expected 5D input (got {input.dim()}D input)")
