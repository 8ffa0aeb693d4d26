"""The functional entries that communicate over ``torch.distributed``: SyncBatchNorm's synchronised
training step (what ``normlab.nn.SyncBatchNorm`` calls) and the merge of per-rank moments (what
``normlab.tools.recalibrate_batch_norm`` calls). The math and the collectives:
``normlab.ops.batch_norm.sync``."""

from __future__ import annotations

from ..ops.batch_norm import sync as _sync

__all__ = ["sync_batch_norm", "group_name", "merge_moments"]

group_name = _sync.group_name  # the name a process group goes by in the custom ops (the key of an agreement)
merge_moments = _sync.merge_moments  # per-rank (count, mean, M2) of each channel merged over a group


def sync_batch_norm(input, running_mean, running_var, weight, bias, momentum, eps, group=None, *, check=True):
    """Training-mode BatchNorm of an ``(N, C, *)`` ``input`` with statistics over every rank of ``group``
    (None: the default group); every rank of the group makes the same call.

    ``running_mean``/``running_var`` (or None) are updated in place, identically on every rank,
    with weight ``momentum`` (a float, or a 0-dim tensor) and the global unbiased variance.
    ``check``: first exchange a fixed-size header so that ranks disagreeing on the number of
    channels fail with a clear error (a layer's first call). A rank may hold no samples. The
    arguments are those a ``normlab.nn.SyncBatchNorm`` has checked.
    """
    return _sync.sync_batch_norm(input, running_mean, running_var, weight, bias, momentum, eps, group, check)
