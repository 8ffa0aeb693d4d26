"""What the normalization modules share: affine parameters and running statistics."""

from __future__ import annotations

import torch
from torch import nn


def register_affine(module: nn.Module, shape, affine: bool, bias: bool, factory_kwargs: dict) -> None:
    """Register ``weight`` (gamma) and ``bias`` (beta) of ``shape``, or None where absent.

    ``bias=False`` registers ``bias`` as None: a layer asked for no bias never has one.
    Values are set by the module's ``reset_parameters``.
    """
    if affine:
        module.weight = nn.Parameter(torch.empty(shape, **factory_kwargs))
        if bias:
            module.bias = nn.Parameter(torch.empty(shape, **factory_kwargs))
        else:
            module.register_parameter("bias", None)
    else:
        module.register_parameter("weight", None)
        module.register_parameter("bias", None)


def reset_affine(module: nn.Module) -> None:
    """gamma (``weight``) to ones, beta (``bias``) to zeros: the identity affine."""
    if module.weight is not None:
        nn.init.ones_(module.weight)
    if module.bias is not None:
        nn.init.zeros_(module.bias)


class _NormBase(nn.Module):
    """Per-channel affine parameters and running statistics (BatchNorm, InstanceNorm).

    State, with torch's names:

    - ``weight`` (gamma, ones) and ``bias`` (beta, zeros), shape ``(C,)``, when
      ``affine``; ``bias=False`` registers ``bias`` as None.
    - ``running_mean`` (zeros), ``running_var`` (ones) and ``num_batches_tracked``
      (a long scalar, 0) when ``track_running_stats``; None otherwise.

    ``state_dict`` version 2 added ``num_batches_tracked``; loading an older
    checkpoint keeps the module's count.
    """

    _version = 2
    __constants__ = ["track_running_stats", "momentum", "eps", "num_features", "affine"]

    def __init__(
        self,
        num_features: int,
        eps: float,
        momentum: float | None,
        affine: bool,
        track_running_stats: bool,
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
        register_affine(self, num_features, affine, bias, factory_kwargs)
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

    def _momentum_factor(self, count):
        """The weight of this batch's statistic in the running ones: ``momentum``, or with
        ``momentum=None`` and a batch count ``count`` (``num_batches_tracked``; None when
        nothing is tracked) the cumulative average's ``1 / (count + 1)`` -- this batch is
        number ``count + 1``. Inside ``torch.compile`` that is a tensor, read when the update
        runs (a float would break the graph on the buffer's value)."""
        if self.momentum is not None:
            return self.momentum
        if count is None:
            return 0.0  # unused: nothing is updated
        if torch.compiler.is_compiling():
            return 1.0 / (count + 1).to(torch.float64)
        return 1.0 / float(count + 1)

    def _check_num_channels(self, input: torch.Tensor) -> None:
        """``input`` has ``num_features`` channels in dim 1."""
        if input.shape[1] != self.num_features:
            raise RuntimeError(
                f"{type(self).__name__}: expected input with {self.num_features} channels "
                f"(num_features) in dim 1, got input of shape {list(input.shape)} with "
                f"{input.shape[1]} channels"
            )

    def reset_running_stats(self) -> None:
        """``running_mean`` to 0, ``running_var`` to 1, ``num_batches_tracked`` to 0."""
        if self.track_running_stats:
            self.running_mean.zero_()
            self.running_var.fill_(1)
            self.num_batches_tracked.zero_()

    def reset_parameters(self) -> None:
        """Reset the running statistics, then gamma to ones and beta to zeros."""
        self.reset_running_stats()
        reset_affine(self)

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
