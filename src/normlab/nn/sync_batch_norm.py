"""SyncBatchNorm: BatchNorm with statistics shared by every rank of a process group.

A drop-in for ``torch.nn.SyncBatchNorm`` -- same constructor, parameters,
buffers, ``state_dict`` and ``convert_sync_batchnorm`` -- that also runs on CPU
tensors (gloo), not only on GPUs. The synchronised step is
``normlab.functional.distributed.sync_batch_norm``; this module decides when to synchronise:

- training, with ``torch.distributed`` initialised and more than one rank in
  the group: statistics over the concatenated batch of every rank (one
  collective in the forward, one in the backward);
- otherwise (evaluation, world size 1, no process group initialised): plain
  ``normlab.functional.batch_norm``, no communication.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..functional import distributed as _sync
from .batch_norm import _BatchNorm

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(_BatchNorm):
    """Batch normalization of an ``(N, C, *)`` input over the batches of every rank of ``process_group``:
    ``y = (x - mean) / sqrt(var + eps) * weight + bias`` with the statistics of the global batch.

    Twin: ``torch.nn.SyncBatchNorm`` -- same constructor, parameters, buffers, ``state_dict`` and
    ``convert_sync_batchnorm``; differs in that it also runs on CPU tensors (gloo), and ranks may
    hold different batch sizes, including none.

    Shapes: input ``(N, C, *)`` (at least 2 dims), output the same; per-channel tensors ``(C,)``.

    Numerics: in training, each channel's mean and biased variance over *all* ranks together,
    exactly BatchNorm over the concatenated batch (per-rank ``(count, mean, M2)`` in float32 for
    float16/bfloat16/float32 input, float64 for float64, merged with Chan's formula);
    ``running_mean``/``running_var`` take the global statistics (unbiased variance), identically
    on every rank, with BatchNorm's ``momentum`` rule. In evaluation, with a single rank, or
    without ``torch.distributed`` initialised it is ``BatchNorm`` on the local batch, with no
    communication. Every rank must call the same SyncBatchNorm layers in the same order; a rank
    that fails or falls silent makes the others raise after the group's timeout.

    >>> import torch, normlab
    >>> bn = normlab.nn.SyncBatchNorm(3)  # no process group: plain BatchNorm
    >>> x = torch.randn(8, 3, 5)
    >>> torch.allclose(bn(x), torch.nn.functional.batch_norm(x, None, None, training=True), atol=1e-6)
    True
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_group=None,
        device=None,
        dtype=None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype, bias=bias)
        self.process_group = process_group
        # (group name, C) of the last input whose channel count the ranks agreed on
        self._agreed: tuple | None = None

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")
        if input.size(1) == 0:
            raise ValueError("SyncBatchNorm number of input channels should be non-zero")

    def _sync_group(self):
        """The group to synchronise over, or None when there is nothing to synchronise with."""
        if not (dist.is_available() and dist.is_initialized()):
            return None
        group = self.process_group if self.process_group is not None else dist.group.WORLD
        if group is dist.GroupMember.NON_GROUP_MEMBER:
            raise RuntimeError(
                f"SyncBatchNorm: rank {dist.get_rank()} is not a member of the layer's process_group; "
                f"give each rank a group it belongs to (torch.distributed.new_group returns a "
                f"non-member placeholder to the ranks outside it)"
            )
        return group if dist.get_world_size(group) > 1 else None

    def _normalize(self, input, running_mean, running_var, weight, bias, use_batch_stats, factor):
        group = self._sync_group() if self.training else None  # evaluation never communicates
        if group is None:
            return super()._normalize(input, running_mean, running_var, weight, bias, use_batch_stats, factor)
        key = (_sync.group_name(group), input.shape[1])
        y = _sync.sync_batch_norm(input, running_mean, running_var, weight, bias, factor, self.eps, group,
                                  check=self._agreed != key)
        self._agreed = key
        return y

    @classmethod
    def convert_sync_batchnorm(cls, module: nn.Module, process_group=None) -> nn.Module:
        """Replace every BatchNorm (torch's or normlab's) in ``module`` with a SyncBatchNorm, in place.

        The new layers take over the very same parameters and buffers, the train/eval flag and
        ``qconfig``; returns ``module`` (or its replacement when ``module`` itself is a BatchNorm).
        As ``torch.nn.SyncBatchNorm.convert_sync_batchnorm``.

        >>> import torch, normlab
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
        >>> normlab.nn.SyncBatchNorm.convert_sync_batchnorm(model)[1]
        SyncBatchNorm(4, eps=1e-05, momentum=0.1, affine=True, bias=True, track_running_stats=True)
        """
        out = module
        if isinstance(module, (nn.modules.batchnorm._BatchNorm, _BatchNorm)) and not isinstance(
            module, nn.modules.batchnorm._LazyNormBase
        ):
            out = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats, process_group, device="meta",
                      bias=module.bias is not None)
            for name in ("weight", "bias"):
                out._parameters[name] = module._parameters.get(name)
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                out._buffers[name] = module._buffers.get(name)
            out.train(module.training)
            if hasattr(module, "qconfig"):
                out.qconfig = module.qconfig
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child, process_group))
        return out
