"""GroupNorm and InstanceNorm.

- ``reference.py``: the math in plain torch ops, the hand-derived backward,
  the autograd Functions (backend ``"ref"``), torch's output-layout rule.
- ``kernels.py``: the Numba kernels (backend ``"cpu"``), imported on first use.
- ``op.py``: what is the kernels' own -- launchers, custom ops
  (``normlab::group_norm_fwd``, ...), the eager and transform forms, declared
  to ``ops/_register`` -- and the entry points of backend ``"cpu"``; the
  ``"ref"`` ones are ``reference.ref_group_norm`` and ``ref_instance_norm``.

Importing this package enters ``group_norm`` and ``instance_norm`` in the
backend table (``"cpu"`` when numba is installed, checked without importing
numba).
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
    output_memory_format,
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
    "output_memory_format",
    "ref_group_norm",
    "ref_instance_norm",
]

_register.implement("group_norm", ref=ref_group_norm, cpu=op.group_norm)
_register.implement("instance_norm", ref=ref_instance_norm, cpu=op.instance_norm)
