"""GroupNorm and InstanceNorm.

- ``reference.py``: the math in plain torch ops, the hand-derived backward,
  InstanceNorm's running-statistics update, the autograd Functions, and the
  ``REF`` path (``ref_group_norm``, ``ref_instance_norm``).

The entries that run each path of the gate (the reference, or the C++ ops
``torch.ops.normlab.group_norm``, ... eager, compiled or under a transform) are the public
functions, ``normlab.functional.group_norm`` and ``instance_norm``.
"""

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
