"""GroupNorm and InstanceNorm.

- ``reference.py``: the math in plain torch ops, the hand-derived backward,
  InstanceNorm's running-statistics update, the autograd Functions, and the
  ``REF`` path (``ref_group_norm``, ``ref_instance_norm``).
- ``op.py``: the entries, one function per op taking the path ``normlab._backend.route``
  decided: the reference, or the C++ ops (``torch.ops.normlab.group_norm``, ...) eager,
  compiled or under a transform (their transform Function).
"""

from . import op  # noqa: F401 (the entries: <family>.op)
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
