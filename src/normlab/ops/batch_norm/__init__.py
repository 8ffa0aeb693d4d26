"""BatchNorm and its running statistics.

- ``reference.py``: the math in plain torch ops, the hand-derived backward,
  the running-statistic update, the autograd Functions (backend ``"ref"``).
- ``kernels.py``: the Numba kernels (backend ``"cpu"``), imported on first use.
- ``op.py``: the kernels as ``torch.library`` custom ops
  (``normlab::batch_norm_train_fwd``, ``normlab::batch_norm_eval_fwd``,
  ``normlab::batch_norm_bwd``, ``normlab::batch_norm_update_stats``) with fake
  implementations and autograd, and the entry point :func:`batch_norm` that
  ``normlab.functional`` calls.

Importing this package registers the ``"cpu"`` backend for ``batch_norm``
(when numba is installed) without importing numba.
"""

from ... import _backend
from .. import _numba
from .op import batch_norm
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
    "batch_norm",
]

if _numba.available():
    _backend.register_backend("cpu", _numba.serves_cpu, ops=("batch_norm",))
