"""Which modules of a model are norm layers, and of which family (torch's, normlab's and the
integrated libraries' classes alike)."""

from __future__ import annotations

from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin

from ..nn import batch_norm as _bn
from ..nn import batch_renorm as _brn
from ..nn import frozen_batch_norm as _fbn
from ..nn import ghost_batch_norm as _gbn
from ..nn import group_norm as _gn
from ..nn import layer_norm as _ln


def _normlab_sync_batch_norm():
    # normlab's SyncBatchNorm may or may not exist in this version: looked up, never required
    from .. import nn as normlab_nn

    return getattr(normlab_nn, "SyncBatchNorm", None)


# The trainable BatchNorm classes of each rank: their eval is BatchNorm's eval with the
# running statistics (BatchRenorm, GhostBatchNorm included), so every tool treats them alike.
_RANKED = (
    (nn.BatchNorm1d, _bn.BatchNorm1d, _brn.BatchRenorm1d, _gbn.GhostBatchNorm1d),
    (nn.BatchNorm2d, _bn.BatchNorm2d, _brn.BatchRenorm2d, _gbn.GhostBatchNorm2d),
    (nn.BatchNorm3d, _bn.BatchNorm3d, _brn.BatchRenorm3d, _gbn.GhostBatchNorm3d),
)


def batch_norm_rank(m: nn.Module) -> int | None:
    """1, 2 or 3 for a trainable BatchNorm1d/2d/3d (torch's or normlab's, BatchRenorm and
    GhostBatchNorm included), 0 for a SyncBatchNorm (any rank), None for anything else
    (frozen layers included, and a Lazy module before its first call: it has no channel count
    yet, and becomes a BatchNorm at that call)."""
    if isinstance(m, LazyModuleMixin):
        return None
    for rank, classes in enumerate(_RANKED, start=1):
        if isinstance(m, classes):
            return rank
    sync = _normlab_sync_batch_norm()
    if isinstance(m, nn.SyncBatchNorm) or (sync is not None and isinstance(m, sync)):
        return 0
    if isinstance(m, (nn.modules.batchnorm._BatchNorm, _bn._BatchNorm)):
        return 0
    return None


def is_batch_norm(m: nn.Module) -> bool:
    """A BatchNorm that computes batch statistics in training (not a frozen one)."""
    return batch_norm_rank(m) is not None


def is_frozen(m: nn.Module) -> bool:
    return isinstance(m, _fbn._FrozenBatchNorm)


_FAMILIES = (
    ("layer2d", (_ln.LayerNorm2d,)),
    ("layer", (nn.LayerNorm, _ln.LayerNorm)),
    ("rms", (nn.RMSNorm, _ln.RMSNorm)),
    ("group", (nn.GroupNorm, _gn.GroupNorm)),
    ("instance", (nn.modules.instancenorm._InstanceNorm, _gn._InstanceNorm)),
)


def is_channels_first_layer_norm(m: nn.Module) -> bool:
    """A ``torch.nn.LayerNorm`` subclass that normalises dim 1 of (N, C, H, W): timm's
    ``LayerNorm2d`` (``tools/timm.py``), transformers' ConvNeXt LayerNorm with
    ``data_format="channels_first"``."""
    if getattr(m, "data_format", None) == "channels_first":
        return True
    from .timm import kind_of

    return kind_of(type(m)) == "LayerNorm2d"


def norm_family(m: nn.Module) -> str | None:
    """``"batch"``, ``"frozen"``, ``"layer"``, ``"layer2d"`` (LayerNorm over the channels of
    (N, C, H, W)), ``"rms"``, ``"group"``, ``"instance"`` or None (a Lazy module before its
    first call included: it becomes a BatchNorm or InstanceNorm at that call)."""
    if isinstance(m, LazyModuleMixin):
        return None
    if is_frozen(m):
        return "frozen"
    if is_batch_norm(m):
        return "batch"
    for name, classes in _FAMILIES:
        if isinstance(m, classes):
            if name == "layer" and type(m) not in classes and is_channels_first_layer_norm(m):
                return "layer2d"
            return name
    return None
