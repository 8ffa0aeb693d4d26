"""Lazy BatchNorm and InstanceNorm: drop-ins for ``torch.nn.LazyBatchNorm1d/2d/3d`` and
``torch.nn.LazyInstanceNorm1d/2d/3d``, which infer ``num_features`` at the first call and then
become normlab's ``BatchNorm*`` / ``InstanceNorm*``.

Built on torch's public ``torch.nn.modules.lazy.LazyModuleMixin``: until the first call the
per-channel parameters and buffers are ``UninitializedParameter`` / ``UninitializedBuffer``
(in ``state_dict`` as torch's are), ``.to(...)`` moves them, and ``load_state_dict`` of a
materialised state materialises them. Where normlab departs from torch's lazy modules:

- the input's rank is checked *before* anything is materialised (torch materialises, becomes
  ``BatchNorm2d``, then refuses the input): a refused first call leaves the module lazy;
- the channel count is read from the channel dim of an unbatched InstanceNorm input too
  (``(C, L)``: ``C``; torch reads ``input.shape[1]``, ``L``, and then refuses the input);
- ``num_features`` is set at the first call also when the module holds no per-channel state
  (``affine=False, track_running_stats=False``: torch leaves it 0) and after a loaded
  ``state_dict`` (from the loaded tensors' shape: torch leaves it 0).

After the first call the module *is* a ``normlab.nn.BatchNorm*`` / ``InstanceNorm*``: an input
with another channel count meets that class's error (BatchNorm: ``RuntimeError``; InstanceNorm
with ``affine=True``: ``ValueError``, as torch's).
"""

from __future__ import annotations

import torch
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

from ._base import _NormBase
from .batch_norm import BatchNorm1d, BatchNorm2d, BatchNorm3d, _BatchNorm
from .group_norm import InstanceNorm1d, InstanceNorm2d, InstanceNorm3d, _InstanceNorm

__all__ = [
    "LazyBatchNorm1d",
    "LazyBatchNorm2d",
    "LazyBatchNorm3d",
    "LazyInstanceNorm1d",
    "LazyInstanceNorm2d",
    "LazyInstanceNorm3d",
]


class _LazyNormBase(LazyModuleMixin, _NormBase):
    """The lazy state: ``num_features`` 0 and uninitialized per-channel tensors until the first
    call, which reads the channel count (:meth:`_channels`) and materialises them."""

    cls_to_become: type | None = None

    def __init__(
        self,
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
        # affine, bias and track_running_stats False here: no tensor made only to be replaced
        super().__init__(0, eps, momentum, False, False, device, dtype, bias=False)
        self.affine = affine
        self.track_running_stats = track_running_stats
        if affine:
            self.weight = UninitializedParameter(**factory_kwargs)
            if bias:
                self.bias = UninitializedParameter(**factory_kwargs)
        if track_running_stats:
            self.running_mean = UninitializedBuffer(**factory_kwargs)
            self.running_var = UninitializedBuffer(**factory_kwargs)
            self.num_batches_tracked = torch.tensor(0, dtype=torch.long, device=device)

    def reset_parameters(self) -> None:
        if not self.has_uninitialized_params() and self.num_features != 0:
            super().reset_parameters()

    def _channels(self, input: torch.Tensor) -> int:
        """The channel count of ``input`` (already checked by ``_check_input_dim``)."""
        return int(input.shape[1])

    def initialize_parameters(self, input: torch.Tensor) -> None:  # type: ignore[override]
        """Judge ``input``'s rank, then give ``num_features`` and the uninitialized tensors the
        channel count: the input's, or that of tensors a ``state_dict`` already materialised."""
        self._check_input_dim(input)
        c = self._channels(input)
        if self.has_uninitialized_params():
            self.num_features = c
            for t in (self.weight, self.bias, self.running_mean, self.running_var):
                if isinstance(t, (UninitializedParameter, UninitializedBuffer)):
                    t.materialize((c,))
            self.reset_parameters()
        else:
            loaded = next((t for t in (self.weight, self.running_mean) if t is not None), None)
            self.num_features = int(loaded.shape[0]) if loaded is not None else c


class _LazyInstanceNorm(_LazyNormBase, _InstanceNorm):
    def _channels(self, input: torch.Tensor) -> int:
        return int(input.shape[input.dim() - self._dims])  # (N, C, *) or unbatched (C, *)


class LazyBatchNorm1d(_LazyNormBase, _BatchNorm):
    """A ``normlab.nn.BatchNorm1d`` whose ``num_features`` is read from its first input's channel
    count (dim 1); after that call the module is a ``normlab.nn.BatchNorm1d``.

    Twin: ``torch.nn.LazyBatchNorm1d`` -- same arguments and defaults (``affine=True``,
    ``track_running_stats=True``), ``repr``, uninitialized parameters and buffers in
    ``state_dict`` before the first call, and class after it (``normlab.nn.lazy`` says where
    normlab is stricter or more exact than torch).

    Shapes, numerics: those of ``normlab.nn.BatchNorm1d``.

    >>> import torch, normlab
    >>> m = normlab.nn.LazyBatchNorm1d()
    >>> y = m(torch.randn(4, 3))
    >>> type(m).__name__, m.num_features, tuple(m.weight.shape)
    ('BatchNorm1d', 3, (3,))
    """

    cls_to_become = BatchNorm1d
    _check_input_dim = BatchNorm1d._check_input_dim


class LazyBatchNorm2d(_LazyNormBase, _BatchNorm):
    """A ``normlab.nn.BatchNorm2d`` whose ``num_features`` is read from its first input's channel
    count (dim 1); after that call the module is a ``normlab.nn.BatchNorm2d``.

    Twin: ``torch.nn.LazyBatchNorm2d`` -- same arguments and defaults (``affine=True``,
    ``track_running_stats=True``), ``repr``, uninitialized parameters and buffers in
    ``state_dict`` before the first call, and class after it (``normlab.nn.lazy`` says where
    normlab is stricter or more exact than torch).

    Shapes, numerics: those of ``normlab.nn.BatchNorm2d``.

    >>> import torch, normlab
    >>> m = normlab.nn.LazyBatchNorm2d()
    >>> y = m(torch.randn(2, 3, 4, 4))
    >>> type(m).__name__, m.num_features, tuple(m.weight.shape)
    ('BatchNorm2d', 3, (3,))
    """

    cls_to_become = BatchNorm2d
    _check_input_dim = BatchNorm2d._check_input_dim


class LazyBatchNorm3d(_LazyNormBase, _BatchNorm):
    """A ``normlab.nn.BatchNorm3d`` whose ``num_features`` is read from its first input's channel
    count (dim 1); after that call the module is a ``normlab.nn.BatchNorm3d``.

    Twin: ``torch.nn.LazyBatchNorm3d`` -- same arguments and defaults (``affine=True``,
    ``track_running_stats=True``), ``repr``, uninitialized parameters and buffers in
    ``state_dict`` before the first call, and class after it (``normlab.nn.lazy`` says where
    normlab is stricter or more exact than torch).

    Shapes, numerics: those of ``normlab.nn.BatchNorm3d``.

    >>> import torch, normlab
    >>> m = normlab.nn.LazyBatchNorm3d()
    >>> y = m(torch.randn(2, 3, 2, 2, 2))
    >>> type(m).__name__, m.num_features, tuple(m.weight.shape)
    ('BatchNorm3d', 3, (3,))
    """

    cls_to_become = BatchNorm3d
    _check_input_dim = BatchNorm3d._check_input_dim


class LazyInstanceNorm1d(_LazyInstanceNorm):
    """A ``normlab.nn.InstanceNorm1d`` whose ``num_features`` is read from its first input's channel
    count (dim 1; dim 0 of an unbatched input); after that call the module is a
    ``normlab.nn.InstanceNorm1d``.

    Twin: ``torch.nn.LazyInstanceNorm1d`` -- same arguments and defaults (``affine=True``,
    ``track_running_stats=True``, where InstanceNorm's are False), ``repr``, uninitialized
    parameters and buffers in ``state_dict`` before the first call, and class after it (``normlab.nn.lazy`` says where
    normlab is stricter or more exact than torch).

    Shapes, numerics: those of ``normlab.nn.InstanceNorm1d``.

    >>> import torch, normlab
    >>> m = normlab.nn.LazyInstanceNorm1d()
    >>> y = m(torch.randn(2, 3, 5))
    >>> type(m).__name__, m.num_features, tuple(m.weight.shape)
    ('InstanceNorm1d', 3, (3,))
    """

    cls_to_become = InstanceNorm1d
    _dims = InstanceNorm1d._dims


class LazyInstanceNorm2d(_LazyInstanceNorm):
    """A ``normlab.nn.InstanceNorm2d`` whose ``num_features`` is read from its first input's channel
    count (dim 1; dim 0 of an unbatched input); after that call the module is a
    ``normlab.nn.InstanceNorm2d``.

    Twin: ``torch.nn.LazyInstanceNorm2d`` -- same arguments and defaults (``affine=True``,
    ``track_running_stats=True``, where InstanceNorm's are False), ``repr``, uninitialized
    parameters and buffers in ``state_dict`` before the first call, and class after it (``normlab.nn.lazy`` says where
    normlab is stricter or more exact than torch).

    Shapes, numerics: those of ``normlab.nn.InstanceNorm2d``.

    >>> import torch, normlab
    >>> m = normlab.nn.LazyInstanceNorm2d()
    >>> y = m(torch.randn(2, 3, 4, 4))
    >>> type(m).__name__, m.num_features, tuple(m.weight.shape)
    ('InstanceNorm2d', 3, (3,))
    """

    cls_to_become = InstanceNorm2d
    _dims = InstanceNorm2d._dims


class LazyInstanceNorm3d(_LazyInstanceNorm):
    """A ``normlab.nn.InstanceNorm3d`` whose ``num_features`` is read from its first input's channel
    count (dim 1; dim 0 of an unbatched input); after that call the module is a
    ``normlab.nn.InstanceNorm3d``.

    Twin: ``torch.nn.LazyInstanceNorm3d`` -- same arguments and defaults (``affine=True``,
    ``track_running_stats=True``, where InstanceNorm's are False), ``repr``, uninitialized
    parameters and buffers in ``state_dict`` before the first call, and class after it (``normlab.nn.lazy`` says where
    normlab is stricter or more exact than torch).

    Shapes, numerics: those of ``normlab.nn.InstanceNorm3d``.

    >>> import torch, normlab
    >>> m = normlab.nn.LazyInstanceNorm3d()
    >>> y = m(torch.randn(2, 3, 2, 2, 2))
    >>> type(m).__name__, m.num_features, tuple(m.weight.shape)
    ('InstanceNorm3d', 3, (3,))
    """

    cls_to_become = InstanceNorm3d
    _dims = InstanceNorm3d._dims
