"""GroupNorm and InstanceNorm.

- ``reference.py``: the math in plain torch ops, the hand-derived backward,
  InstanceNorm's running-statistics update, the autograd Functions, and the
  entry points of backend ``"ref"`` (``ref_group_norm``, ``ref_instance_norm``).
- ``op.py``: the entry points of backend ``"cpu"``, on the C++ ops
  (``torch.ops.normlab.group_norm``, ...), and their transform Function.

Importing this package enters ``group_norm`` and ``instance_norm`` in the
backend table (``"cpu"`` when the C++ extension is installed).
"""

from .. import _register
from . import op
from .reference import (
    GroupNormFunction,
    InstanceNormEvalFunction,
    group_norm_backward_ref,
    group_norm_ref,
    group_norm_stats,
    instance_norm_eval_backward_ref,
    instance_norm_eval_ref,
    ref_group_norm,
    ref_instance_norm,
)

__all__ = [
    "group_norm_stats",
    "group_norm_ref",
    "instance_norm_eval_ref",
    "group_norm_backward_ref",
    "instance_norm_eval_backward_ref",
    "GroupNormFunction",
    "InstanceNormEvalFunction",
    "ref_group_norm",
    "ref_instance_norm",
]

_register.implement("group_norm", ref=ref_group_norm, cpu=op.group_norm)
_register.implement("instance_norm", ref=ref_instance_norm, cpu=op.instance_norm)
