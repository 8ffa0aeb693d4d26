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
        # each parameter and buffer read once, from the module's dicts (Module.__getattr__ costs
        # ~0.6 us a name); a parametrized weight or a replaced attribute is not in them
        p, b = self._parameters, self._buffers
        try:
            weight, bias = p["weight"], p["bias"]
            running_mean, running_var, count = b["running_mean"], b["running_var"], b["num_batches_tracked"]
        except KeyError:
            weight, bias = self.weight, self.bias
            running_mean, running_var, count = self.running_mean, self.running_var, self.num_batches_tracked
        # Only where the module holds per-channel tensors: without weight and running
        # statistics torch accepts any channel count, and so do we.
        if weight is not None or running_mean is not None:
            self._check_num_channels(input)

        training = self.training
        if not (training and self.track_running_stats):
            count = None  # this batch is counted only in training with tracked statistics
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
    """Batch normalization of an ``(N, C)`` or ``(N, C, L)`` input, per channel over ``N`` (and ``L``):
    ``y = (x - mean) / sqrt(var + eps) * weight + bias``.

    Twin: ``torch.nn.BatchNorm1d`` -- same arguments, defaults, parameters (``weight``, ``bias``),
    buffers (``running_mean``, ``running_var``, ``num_batches_tracked``), ``state_dict`` keys and
    versioning, ``repr`` and train/eval behaviour; ``momentum`` outside ``[0, 1]`` is refused.

    Shapes: input ``(N, C)`` or ``(N, C, L)``, output the same; every per-channel tensor ``(C,)``.

    Numerics: training normalises with the batch's mean and *biased* variance per channel and
    updates ``running = (1 - momentum) * running + momentum * stat`` with the *unbiased* variance
    (``n / (n - 1)``) in ``running_var``; ``momentum=None`` makes the running statistics the
    plain average of every batch so far (weight ``1 / num_batches_tracked``). Eval normalises
    with the running statistics (with the batch's when ``track_running_stats=False``).
    Statistics are accumulated in float32 for float16/bfloat16/float32 input and float64 for
    float64 (fixed chunks merged in a fixed order: the same bits on any number of threads);
    the output is cast once.

    >>> import torch, normlab
    >>> bn = normlab.nn.BatchNorm1d(2)
    >>> bn(torch.tensor([[1.0, 10.0], [3.0, 30.0]]))
    tensor([[-1.0000, -1.0000],
            [ 1.0000,  1.0000]], grad_fn=<...>)
    >>> bn.running_mean, bn.running_var  # 0.9 * (0, 1) + 0.1 * (mean, unbiased var)
    (tensor([0.2000, 2.0000]), tensor([ 1.1000, 20.9000]))
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() != 2 and input.dim() != 3:
            raise ValueError(f"expected 2D or 3D input (got {input.dim()}D input)")


class BatchNorm2d(_BatchNorm):
    """Batch normalization of an ``(N, C, H, W)`` input, per channel over ``N, H, W``:
    ``y = (x - mean) / sqrt(var + eps) * weight + bias``.

    Twin: ``torch.nn.BatchNorm2d`` -- same arguments, defaults, parameters (``weight``, ``bias``),
    buffers (``running_mean``, ``running_var``, ``num_batches_tracked``), ``state_dict`` keys and
    versioning, ``repr`` and train/eval behaviour; ``momentum`` outside ``[0, 1]`` is refused.

    Shapes: input ``(N, C, H, W)``, output the same (a ``channels_last`` input gives a ``channels_last`` output); every per-channel tensor ``(C,)``.

    Numerics: training normalises with the batch's mean and *biased* variance per channel and
    updates ``running = (1 - momentum) * running + momentum * stat`` with the *unbiased* variance
    (``n / (n - 1)``) in ``running_var``; ``momentum=None`` makes the running statistics the
    plain average of every batch so far (weight ``1 / num_batches_tracked``). Eval normalises
    with the running statistics (with the batch's when ``track_running_stats=False``).
    Statistics are accumulated in float32 for float16/bfloat16/float32 input and float64 for
    float64 (fixed chunks merged in a fixed order: the same bits on any number of threads);
    the output is cast once.

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
    """Batch normalization of an ``(N, C, D, H, W)`` input, per channel over ``N, D, H, W``:
    ``y = (x - mean) / sqrt(var + eps) * weight + bias``.

    Twin: ``torch.nn.BatchNorm3d`` -- same arguments, defaults, parameters (``weight``, ``bias``),
    buffers (``running_mean``, ``running_var``, ``num_batches_tracked``), ``state_dict`` keys and
    versioning, ``repr`` and train/eval behaviour; ``momentum`` outside ``[0, 1]`` is refused.

    Shapes: input ``(N, C, D, H, W)``, output the same; every per-channel tensor ``(C,)``.

    Numerics: training normalises with the batch's mean and *biased* variance per channel and
    updates ``running = (1 - momentum) * running + momentum * stat`` with the *unbiased* variance
    (``n / (n - 1)``) in ``running_var``; ``momentum=None`` makes the running statistics the
    plain average of every batch so far (weight ``1 / num_batches_tracked``). Eval normalises
    with the running statistics (with the batch's when ``track_running_stats=False``).
    Statistics are accumulated in float32 for float16/bfloat16/float32 input and float64 for
    float64 (fixed chunks merged in a fixed order: the same bits on any number of threads);
    the output is cast once.

    >>> import torch, normlab
    >>> bn = normlab.nn.BatchNorm3d(2, affine=False, momentum=None)
    >>> y = bn(torch.randn(2, 2, 3, 4, 4))
    >>> bool(y.mean(dim=(0, 2, 3, 4)).abs().max() < 1e-5), int(bn.num_batches_tracked)
    (True, 1)
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() != 5:
            raise ValueError(f"expected 5D input (got {input.dim()}D input)")
