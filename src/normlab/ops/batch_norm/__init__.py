"""BatchNorm, its running statistics and its variants.

- ``reference.py``: the math in plain torch ops, the hand-derived backward,
  the running-statistic update, the autograd Functions, and the ``REF`` path
  (``ref_batch_norm``).
- ``sync.py``: SyncBatchNorm, the statistics and gradient sums merged across the
  ranks (the collectives of ``torch.distributed``); ``sync_parts.py``: its per-rank
  computations on each backend.
- ``ghost.py``: GhostBatchNorm's virtual batches as channels of one BatchNorm call;
  ``renorm.py``: BatchRenorm's correction ``r``, ``d``.

The entry that runs each path of the gate (the reference, or the C++ ops
``torch.ops.normlab.batch_norm_*`` eager, compiled or under a transform) is the public function,
``normlab.functional.batch_norm``.
"""

from .reference import (
    BatchNormEvalFunction,
    BatchNormTrainFunction,
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
