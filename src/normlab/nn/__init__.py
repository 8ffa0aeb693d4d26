"""normlab.nn: Modules that are drop-ins for torch.nn's normalization layers.

Same constructor arguments and defaults, parameter and buffer names,
``state_dict`` keys and train/eval behaviour as their torch.nn twins; the math
runs through ``normlab.functional``.
"""

from .batch_norm import BatchNorm1d, BatchNorm2d, BatchNorm3d
from .batch_renorm import BatchRenorm1d, BatchRenorm2d, BatchRenorm3d
from .dyt import DyT
from .frozen_batch_norm import FrozenBatchNorm1d, FrozenBatchNorm2d, FrozenBatchNorm3d
from .ghost_batch_norm import GhostBatchNorm1d, GhostBatchNorm2d, GhostBatchNorm3d
from .group_norm import GroupNorm, InstanceNorm1d, InstanceNorm2d, InstanceNorm3d
from .layer_norm import LayerNorm, LayerNorm2d, RMSNorm
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
    "BatchNormAct2d",
    "FrozenBatchNormAct2d",
    "GroupNormAct",
    "LayerNormAct",
    "LayerNormAct2d",
]
