"""normlab.nn: Modules that are drop-ins for torch.nn's normalization layers.

Same constructor arguments and defaults, parameter and buffer names,
``state_dict`` keys and train/eval behaviour as their torch.nn twins; the math
runs through ``normlab.functional``.
"""

from .batch_norm import BatchNorm1d, BatchNorm2d, BatchNorm3d
from .batch_renorm import BatchRenorm1d, BatchRenorm2d, BatchRenorm3d
from .dyt import DyT
from .evo_norm import EvoNorm2dB0, EvoNorm2dS0
from .frn import FilterResponseNormAct2d, FilterResponseNormTlu2d
from .frozen_batch_norm import FrozenBatchNorm1d, FrozenBatchNorm2d, FrozenBatchNorm3d
from .ghost_batch_norm import GhostBatchNorm1d, GhostBatchNorm2d, GhostBatchNorm3d
from .group_norm import GroupNorm, InstanceNorm1d, InstanceNorm2d, InstanceNorm3d
from .layer_norm import LayerNorm, LayerNorm2d, RMSNorm
from .lazy import (
    LazyBatchNorm1d,
    LazyBatchNorm2d,
    LazyBatchNorm3d,
    LazyInstanceNorm1d,
    LazyInstanceNorm2d,
    LazyInstanceNorm3d,
)
from .local_response_norm import CrossMapLRN2d, LocalResponseNorm
from .scale_norm import RmsNorm2d, SimpleNorm, SimpleNorm2d
from .norm_act import BatchNormAct2d, FrozenBatchNormAct2d, GroupNormAct, LayerNormAct, LayerNormAct2d
from .sync_batch_norm import SyncBatchNorm

__all__ = [
    "LayerNorm",
    "RMSNorm",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "FrozenBatchNorm1d",
    "FrozenBatchNorm2d",
    "FrozenBatchNorm3d",
    "GroupNorm",
    "InstanceNorm1d",
    "InstanceNorm2d",
    "InstanceNorm3d",
    "SyncBatchNorm",
    "LayerNorm2d",
    "BatchRenorm1d",
    "BatchRenorm2d",
    "BatchRenorm3d",
    "GhostBatchNorm1d",
    "GhostBatchNorm2d",
    "GhostBatchNorm3d",
    "DyT",
    "LazyBatchNorm1d",
    "LazyBatchNorm2d",
    "LazyBatchNorm3d",
    "LazyInstanceNorm1d",
    "LazyInstanceNorm2d",
    "LazyInstanceNorm3d",
    "LocalResponseNorm",
    "CrossMapLRN2d",
    "RmsNorm2d",
    "SimpleNorm",
    "SimpleNorm2d",
    "FilterResponseNormTlu2d",
    "FilterResponseNormAct2d",
    "EvoNorm2dB0",
    "EvoNorm2dS0",
    "BatchNormAct2d",
    "FrozenBatchNormAct2d",
    "GroupNormAct",
    "LayerNormAct",
    "LayerNormAct2d",
]
