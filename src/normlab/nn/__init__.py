"""normlab.nn: Modules that are drop-ins for torch.nn's normalization layers.

Same constructor arguments and defaults, parameter and buffer names,
``state_dict`` keys and train/eval behaviour as their torch.nn twins; the math
runs through ``normlab.functional``.
"""

from .layer_norm import LayerNorm, RMSNorm

__all__ = ["LayerNorm", "RMSNorm"]

try:  # the BatchNorm and GroupNorm/InstanceNorm rooms
    from .batch_norm import BatchNorm1d, BatchNorm2d, BatchNorm3d  # noqa: F401

    __all__ += ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d"]
except ImportError:  # pragma: no cover - transitional
    pass
try:
    from .group_norm import GroupNorm, InstanceNorm1d, InstanceNorm2d, InstanceNorm3d  # noqa: F401

    __all__ += ["GroupNorm", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"]
except ImportError:  # pragma: no cover - transitional
    pass
