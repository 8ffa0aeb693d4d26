"""Frozen BatchNorm: the eval formula with fixed statistics and affine, in every mode.

``FrozenBatchNorm1d/2d/3d`` hold ``weight``, ``bias``, ``running_mean`` and
``running_var`` as *buffers* (no parameters: nothing for an optimizer to
update) and compute, in training and in eval alike::

    y = (x - running_mean) / sqrt(running_var + eps) * weight + bias

so ``model.train()`` changes nothing: no statistic is computed, none is
updated, and a sample's output never depends on its batch mates. The input
gradient still flows. The per-channel scale-and-shift runs in normlab's fused
eval-mode BatchNorm kernel (``normlab.functional.batch_norm`` with
``training=False``), forward and backward, for every layout BatchNorm takes
(``channels_last`` included).

``state_dict`` has exactly the four buffers, under the names torchvision's
``FrozenBatchNorm2d`` uses, so checkpoints move between the two; a BatchNorm
checkpoint loads too (its ``num_batches_tracked`` is dropped).

``normlab.freeze_batch_norm(model)`` swaps a model's BatchNorm layers for these
in place and ``normlab.unfreeze_batch_norm(model)`` swaps them back.

>>> import torch, normlab
>>> bn = torch.nn.BatchNorm2d(3).eval()
>>> frozen = normlab.nn.FrozenBatchNorm2d(3)
>>> frozen.load_state_dict(bn.state_dict())
<All keys matched successfully>
>>> x = torch.randn(2, 3, 4, 4)
>>> torch.allclose(frozen.train()(x), bn(x), atol=1e-6)
True
"""

from __future__ import annotations

import torch
from torch import nn

from .. import functional as F
from ._base import _NotScriptable, check_dtype, check_eps, check_size

__all__ = ["FrozenBatchNorm1d", "FrozenBatchNorm2d", "FrozenBatchNorm3d"]


class _FrozenBatchNorm(_NotScriptable, nn.Module):
    """Shared body of ``FrozenBatchNorm1d/2d/3d``: any ``(N, C, *)`` input.

    Used as is for a frozen ``SyncBatchNorm``: once the statistics are fixed
    there is nothing left to synchronise, and SyncBatchNorm takes any rank.
    """

    __constants__ = ["num_features", "eps"]

    def __init__(self, num_features: int, eps: float = 1e-5, device=None, dtype=None) -> None:
        cls = type(self).__name__
        num_features = check_size(cls, "num_features", num_features, "the number of channels C")
        check_eps(cls, eps)
        check_dtype(cls, dtype)
        super().__init__()
        factory_kwargs = {"device": device, "dtype": dtype}
        self.num_features = num_features
        self.eps = eps
        # buffers, not parameters: state that moves with .to() and is saved, never trained
        self.register_buffer("weight", torch.ones(num_features, **factory_kwargs))
        self.register_buffer("bias", torch.zeros(num_features, **factory_kwargs))
        self.register_buffer("running_mean", torch.zeros(num_features, **factory_kwargs))
        self.register_buffer("running_var", torch.ones(num_features, **factory_kwargs))

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if input.shape[1] != self.num_features:
            raise RuntimeError(
                f"{type(self).__name__}: expected input with {self.num_features} channels "
                f"(num_features) in dim 1, got input of shape {list(input.shape)} with "
                f"{input.shape[1]} channels"
            )
        # training=False whatever self.training says: the running statistics, always
        return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                            False, 0.0, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}"

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ) -> None:
        # A BatchNorm checkpoint counts its batches; a frozen layer has nothing to count.
        # (load_state_dict hands each module its own copy of the dict: popping is safe.)
        state_dict.pop(prefix + "num_batches_tracked", None)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )


class FrozenBatchNorm1d(_FrozenBatchNorm):
    """BatchNorm1d's eval formula with fixed buffers, in every mode:
    ``y = (x - running_mean) / sqrt(running_var + eps) * weight + bias``.

    No torch.nn twin: ``torchvision.ops.FrozenBatchNorm2d``'s ``state_dict`` (the four buffers,
    no ``num_batches_tracked``; a BatchNorm checkpoint loads too). Unlike a BatchNorm in eval
    mode, ``model.train()`` changes nothing: no statistic is computed or updated, and a sample's
    output never depends on its batch. The input gradient flows; nothing is a Parameter.

    Shapes: input ``(N, C)`` or ``(N, C, L)``, output the same; ``weight``, ``bias``, ``running_mean``,
    ``running_var``: ``(C,)`` buffers.

    Numerics: BatchNorm's eval kernel: ``1 / sqrt(running_var + eps)`` in float32 for
    float16/bfloat16/float32 input (float64 for float64), output cast once.

    >>> import torch, normlab
    >>> frozen = normlab.nn.FrozenBatchNorm1d(4)
    >>> frozen.running_var.fill_(4.0)[:1]
    tensor([4.])
    >>> bool(torch.allclose(frozen(torch.full((2, 4), 2.0)), torch.ones(2, 4), atol=1e-5))
    True
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() != 2 and input.dim() != 3:
            raise ValueError(f"expected 2D or 3D input (got {input.dim()}D input)")


class FrozenBatchNorm2d(_FrozenBatchNorm):
    """BatchNorm2d's eval formula with fixed buffers, in every mode:
    ``y = (x - running_mean) / sqrt(running_var + eps) * weight + bias``.

    No torch.nn twin: ``torchvision.ops.FrozenBatchNorm2d``'s ``state_dict`` (the four buffers,
    no ``num_batches_tracked``; a BatchNorm checkpoint loads too). Unlike a BatchNorm in eval
    mode, ``model.train()`` changes nothing: no statistic is computed or updated, and a sample's
    output never depends on its batch. The input gradient flows; nothing is a Parameter.

    Shapes: input ``(N, C, H, W)``, output the same; ``weight``, ``bias``, ``running_mean``,
    ``running_var``: ``(C,)`` buffers.

    Numerics: BatchNorm's eval kernel: ``1 / sqrt(running_var + eps)`` in float32 for
    float16/bfloat16/float32 input (float64 for float64), output cast once.

    >>> import torch, normlab
    >>> bn = torch.nn.BatchNorm2d(3).eval()
    >>> frozen = normlab.nn.FrozenBatchNorm2d(3)
    >>> frozen.load_state_dict(bn.state_dict())
    <All keys matched successfully>
    >>> x = torch.randn(2, 3, 4, 4)
    >>> torch.allclose(frozen.train()(x), bn(x), atol=1e-6)
    True
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() != 4:
            raise ValueError(f"expected 4D input (got {input.dim()}D input)")


class FrozenBatchNorm3d(_FrozenBatchNorm):
    """BatchNorm3d's eval formula with fixed buffers, in every mode:
    ``y = (x - running_mean) / sqrt(running_var + eps) * weight + bias``.

    No torch.nn twin: ``torchvision.ops.FrozenBatchNorm2d``'s ``state_dict`` (the four buffers,
    no ``num_batches_tracked``; a BatchNorm checkpoint loads too). Unlike a BatchNorm in eval
    mode, ``model.train()`` changes nothing: no statistic is computed or updated, and a sample's
    output never depends on its batch. The input gradient flows; nothing is a Parameter.

    Shapes: input ``(N, C, D, H, W)``, output the same; ``weight``, ``bias``, ``running_mean``,
    ``running_var``: ``(C,)`` buffers.

    Numerics: BatchNorm's eval kernel: ``1 / sqrt(running_var + eps)`` in float32 for
    float16/bfloat16/float32 input (float64 for float64), output cast once.

    >>> import torch, normlab
    >>> normlab.nn.FrozenBatchNorm3d(2)(torch.zeros(1, 2, 1, 2, 2)).shape
    torch.Size([1, 2, 1, 2, 2])
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() != 5:
            raise ValueError(f"expected 5D input (got {input.dim()}D input)")
