"""BatchNorm and its running statistics.

- ``reference.py``: the math in plain torch ops, the hand-derived backward,
  the running-statistic update, the autograd Functions (backend ``"ref"``).
- ``op.py``: the entry point of backend ``"cpu"`` on the C++ ops
  ``torch.ops.normlab.batch_norm_*`` (``csrc/batch_norm.cpp``, ``csrc/cpu/``,
  ``csrc/autograd/``, ``csrc/meta/``) and the transform Function; the ``"ref"``
  one is ``reference.ref_batch_norm``.
- ``sync.py``: SyncBatchNorm (the only caller of ``torch.distributed``);
  ``ghost.py``, ``renorm.py``: GhostBatchNorm, BatchRenorm on BatchNorm's ops.

Importing this package enters ``batch_norm`` in the backend table (``"cpu"``
when the C++ extension is installed).
"""

from .. import _register, extension
from . import op
from .reference import (  # noqa: F401 (private names: those of the room's former single module)
    BatchNormEvalFunction,
    BatchNormTrainFunction,
    _channel_mean,
    _channel_sum,
    _mean_var_xc,
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

_register.implement("batch_norm", ref=ref_batch_norm, cpu=op.batch_norm, available=extension.available)
