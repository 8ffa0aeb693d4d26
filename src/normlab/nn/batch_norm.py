"""BatchNorm modules: drop-ins for ``torch.nn.BatchNorm1d`` / ``2d`` / ``3d``.

Same constructor, parameters (``weight``, ``bias``), buffers (``running_mean``,
``running_var``, ``num_batches_tracked``), ``state_dict`` keys and versioning,
``repr`` and train/eval behaviour as torch's. The statistics are computed in
``normlab.functional.batch_norm``; a module only decides which statistics to
use and with what momentum.
"""

from __future__ import annotations

import torch

from .. import functional as F
from ._base import _NormBase

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d"]


class _BatchNorm(_NormBase):
    """Shared body of ``BatchNorm1d/2d/3d``; subclasses only say which input ranks they take.

    State (parameters, buffers, ``state_dict`` versioning): ``_NormBase``.

    ``forward`` normalises with the batch's statistics in training mode (and in
    eval mode when there are no running statistics), with the running ones
    otherwise. In training with ``track_running_stats`` it blends the batch
    statistics into the running ones with weight ``momentum`` (the unbiased
    variance goes into ``running_var``) and counts the batch in
    ``num_batches_tracked``; ``momentum=None`` makes the running statistics the
    plain average of every batch seen (weight ``1 / num_batches_tracked``).
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device=None,
        dtype=None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype, bias=bias)

    def _check_input_dim(self, input: torch.Tensor) -> None:
        raise NotImplementedError

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        # each parameter and buffer read once: a module attribute lookup costs ~1 us
        weight, bias = self.weight, self.bias
        running_mean, running_var = self.running_mean, self.running_var
        # Only where the module holds per-channel tensors: without weight and running
        # statistics torch accepts any channel count, and so do we.
        if weight is not None or running_mean is not None:
            self._check_num_channels(input)

        training = self.training
        count = self.num_batches_tracked if training and self.track_running_stats else None
        # Batch statistics in training, and in eval when there are no running ones.
        use_batch_stats = training or (running_mean is None and running_var is None)
        # Running statistics are passed only to be used (eval) or to be updated (tracking).
        pass_running = not training or self.track_running_stats
        y = self._normalize(
            input,
            running_mean if pass_running else None,
            running_var if pass_running else None,
            weight,
            bias,
            use_batch_stats,
            self._momentum_factor(count),
        )
        # Counted after the call succeeded, so a rejected input leaves the count as it was.
        if count is not None:
            count.add_(1)
        return y

    def _normalize(self, input, running_mean, running_var, weight, bias, use_batch_stats, factor):
        """The normalisation itself, with the statistics :meth:`forward` chose (``factor``: the
        weight of the new batch statistic); SyncBatchNorm takes its statistics across ranks."""
        return F.batch_norm(input, running_mean, running_var, weight, bias, use_batch_stats, factor, self.eps)


class BatchNorm1d(_BatchNorm):
    """Batch normalization of an ``(N, C)`` or ``(N, C, L)`` input, per channel.

    ``y = (x - mean) / sqrt(var + eps) * weight + bias`` with the mean and the
    biased variance of channel ``c`` over the batch (and ``L``) in training,
    and the running estimates in eval. Drop-in for ``torch.nn.BatchNorm1d``.

    >>> import torch, normlab
    >>> bn = normlab.nn.BatchNorm1d(3)
    >>> y = bn(torch.randn(8, 3))
    >>> y.shape, int(bn.num_batches_tracked)
    (torch.Size([8, 3]), 1)
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() != 2 and input.dim() != 3:
            raise ValueError(f"expected 2D or 3D input (got {input.dim()}D input)")


class BatchNorm2d(_BatchNorm):
    """Batch normalization of an ``(N, C, H, W)`` input, per channel over ``N, H, W``.

    Drop-in for ``torch.nn.BatchNorm2d``; a ``channels_last`` input gives a
    ``channels_last`` output.

    >>> import torch, normlab
    >>> bn = normlab.nn.BatchNorm2d(4).eval()  # eval: running statistics (0 and 1 here)
    >>> x = torch.randn(2, 4, 5, 5)
    >>> torch.allclose(bn(x), x / (1 + 1e-5) ** 0.5)
    True
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() != 4:
            raise ValueError(f"expected 4D input (got {input.dim()}D input)")


class BatchNorm3d(_BatchNorm):
    """Batch normalization of an ``(N, C, D, H, W)`` input, per channel over ``N, D, H, W``.

    Drop-in for ``torch.nn.BatchNorm3d``.

    >>> import torch, normlab
    >>> bn = normlab.nn.BatchNorm3d(2, affine=False)
    >>> y = bn(torch.randn(2, 2, 3, 4, 4))
    >>> bool(y.mean(dim=(0, 2, 3, 4)).abs().max() < 1e-5)
    True
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() != 5:
            raise ValueError(f"expected 5D input (got {input.dim()}D input)")
