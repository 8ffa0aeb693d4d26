"""BatchNorm and its running statistics.

- ``reference.py``: the math in plain torch ops, the hand-derived backward,
  the running-statistic update, the autograd Functions (backend ``"ref"``).
- ``kernels.py``: the Numba kernels (backend ``"cpu"``), imported on first use.
- ``op.py``: what is the kernels' own -- launchers, custom ops
  (``normlab::batch_norm_train_fwd``, ``normlab::batch_norm_eval_fwd``,
  ``normlab::batch_norm_bwd``, ``normlab::batch_norm_update_stats``), the eager
  and transform forms, declared to ``ops/_register`` -- and the entry point of
  backend ``"cpu"``; the ``"ref"`` one is ``reference.ref_batch_norm``.

Importing this package enters ``batch_norm`` in the backend table (``"cpu"``
when numba is installed, checked without importing numba).
"""

from .. import _register
from . import op
from .reference import (  # noqa: F401 (private names: those of the room's former single module)
    BatchNormEvalFunction,
    BatchNormTrainFunction,
    _channel_mean,
    _channel_sum,
    _mean_var_xc,
    _memory_format,
    _per_channel,
    _reduce_dims,
    _stat_shape,
    batch_norm_eval_backward_ref,
    batch_norm_eval_ref,
    batch_norm_ref,
    batch_norm_stats,
    batch_norm_train_backward_ref,
    batch_norm_train_ref,
    ref_batch_norm,
    update_running_stats,
)

__all__ = [
    "batch_norm_stats",
    "batch_norm_train_ref",
    "batch_norm_eval_ref",
    "update_running_stats",
    "batch_norm_train_backward_ref",
    "batch_norm_eval_backward_ref",
    "BatchNormTrainFunction",
    "BatchNormEvalFunction",
    "batch_norm_ref",
    "ref_batch_norm",
]

_register.implement("batch_norm", ref=ref_batch_norm, cpu=op.batch_norm)
