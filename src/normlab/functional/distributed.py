"""The functional entry that communicates: SyncBatchNorm's synchronised training step, the one
``normlab.nn.SyncBatchNorm`` calls (its math and collectives: ``normlab.ops.batch_norm.sync``)."""

from __future__ import annotations

from ..ops.batch_norm import sync as _sync

__all__ = ["sync_batch_norm", "group_name"]

group_name = _sync.group_name  # the name a process group goes by in the custom ops (the key of an agreement)


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
