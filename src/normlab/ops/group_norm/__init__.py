"""GroupNorm and InstanceNorm.

- ``reference.py``: the math in plain torch ops, the hand-derived backward,
  the autograd Functions (backend ``"ref"``), torch's output-layout rule.
- ``kernels.py``: the Numba kernels (backend ``"cpu"``), imported on first use.
- ``op.py``: the kernels as ``torch.library`` custom ops
  (``normlab::group_norm_fwd``, ...) with fake implementations and autograd,
  and the entry points :func:`group_norm`, :func:`instance_norm` that
  ``normlab.functional`` calls.

Importing this package registers the ``"cpu"`` backend for ``group_norm`` and
``instance_norm`` (when numba is installed) without importing numba.
"""

from ... import _backend
from .. import _numba
from .op import group_norm, instance_norm
from .reference import (
    GroupNormFunction,
    InstanceNormEvalFunction,
    group_norm_backward_ref,
    group_norm_ref,
    group_norm_stats,
    instance_norm_eval_backward_ref,
    instance_norm_eval_ref,
    output_memory_format,
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
    "group_norm",
    "instance_norm",
]

if _numba.available():
    _backend.register_backend("cpu", _numba.serves_cpu, ops=("group_norm", "instance_norm"))
