"""BatchNorm modules: drop-ins for ``torch.nn.BatchNorm1d`` / ``2d`` / ``3d``.

Same constructor, parameters (``weight``, ``bias``), buffers (``running_mean``,
``running_var``, ``num_batches_tracked``), ``state_dict`` keys and versioning,
``repr`` and train/eval behaviour as torch's. The statistics are computed in
``normlab.functional.batch_norm``; a module only decides which statistics to
use and with what momentum.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import functional as F

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d"]


class _BatchNorm(nn.Module):
    """Shared body of ``BatchNorm1d/2d/3d``; subclasses only say which input ranks they take.

    State:

    - ``weight`` (gamma, ones) and ``bias`` (beta, zeros), shape ``(C,)``, when
      ``affine``; ``bias=False`` registers ``bias`` as None.
    - ``running_mean`` (zeros), ``running_var`` (ones) and ``num_batches_tracked``
      (a long scalar, 0) when ``track_running_stats``; None otherwise.

    ``forward`` normalises with the batch's statistics in training mode (and in
    eval mode when there are no running statistics), with the running ones
    otherwise. In training with ``track_running_stats`` it blends the batch
    statistics into the running ones with weight ``momentum`` (the unbiased
    variance goes into ``running_var``) and counts the batch in
    ``num_batches_tracked``; ``momentum=None`` makes the running statistics the
    plain average of every batch seen (weight ``1 / num_batches_tracked``).
    """

    _version = 2
    __constants__ = ["track_running_stats", "momentum", "eps", "num_features", "affine"]
    _expected_dims: tuple[int, ...] = ()

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
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        if affine:
            self.weight = nn.Parameter(torch.empty(num_features, **factory_kwargs))
            if bias:
                self.bias = nn.Parameter(torch.empty(num_features, **factory_kwargs))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", torch.zeros(num_features, **factory_kwargs))
            self.register_buffer("running_var", torch.ones(num_features, **factory_kwargs))
            # a count, never a float: it keeps only the device of factory_kwargs
            self.register_buffer(
                "num_batches_tracked", torch.tensor(0, dtype=torch.long, device=device)
            )
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        """``running_mean`` to 0, ``running_var`` to 1, ``num_batches_tracked`` to 0."""
        if self.track_running_stats:
            self.running_mean.zero_()
            self.running_var.fill_(1)
            self.num_batches_tracked.zero_()

    def reset_parameters(self) -> None:
        """Reset the running statistics, then gamma to ones and beta to zeros."""
        self.reset_running_stats()
        if self.affine:
            nn.init.ones_(self.weight)
            if self.bias is not None:
                nn.init.zeros_(self.bias)

    def _check_input_dim(self, input: torch.Tensor) -> None:
        raise NotImplementedError

    def _check_num_channels(self, input: torch.Tensor) -> None:
        # Only where the module holds per-channel tensors: without weight and
        # running statistics torch accepts any channel count, and so do we.
        holds_per_channel = self.weight is not None or self.running_mean is not None
        if holds_per_channel and input.shape[1] != self.num_features:
            raise RuntimeError(
                f"{type(self).__name__}: expected input with {self.num_features} channels "
                f"(num_features) in dim 1, got input of shape {list(input.shape)} with "
                f"{input.shape[1]} channels"
            )

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        self._check_num_channels(input)

        # The weight of the new batch statistic. Without tracking it is unused.
        factor = 0.0 if self.momentum is None else self.momentum
        tracking = self.training and self.track_running_stats and self.num_batches_tracked is not None
        if tracking and self.momentum is None:
            # cumulative average: this batch will be number num_batches_tracked + 1
            factor = 1.0 / float(self.num_batches_tracked + 1)

        # Batch statistics in training, and in eval when there are no running ones.
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        # Running statistics are passed only to be used (eval) or to be updated (tracking).
        pass_running = not self.training or self.track_running_stats
        y = F.batch_norm(
            input,
            self.running_mean if pass_running else None,
            self.running_var if pass_running else None,
            self.weight,
            self.bias,
            use_batch_stats,
            factor,
            self.eps,
        )
        # Counted after the call succeeded, so a rejected input leaves the count as it was.
        if tracking:
            self.num_batches_tracked.add_(1)
        return y

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
            f"affine={self.affine}, bias={self.bias is not None}, "
            f"track_running_stats={self.track_running_stats}"
        )

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ) -> None:
        version = local_metadata.get("version", None)
        if (version is None or version < 2) and self.track_running_stats:
            # Checkpoints before version 2 have no num_batches_tracked: keep ours (or 0).
            key = prefix + "num_batches_tracked"
            if key not in state_dict:
                nbt = self.num_batches_tracked
                state_dict[key] = (
                    nbt
                    if nbt is not None and nbt.device != torch.device("meta")
                    else torch.tensor(0, dtype=torch.long)
                )
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )


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
