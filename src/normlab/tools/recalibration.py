"""Recompute BatchNorm running statistics exactly, over a set of batches.

``recalibrate_batch_norm(model, batches)`` runs the model once over ``batches``
and sets each BatchNorm layer's ``running_mean`` and ``running_var`` to the
*population* mean and unbiased variance of everything that layer received: all
samples and positions of all batches, pooled as if they had been one batch.

Why not what training leaves behind, or ``torch.optim.swa_utils.update_bn``:

- training's running statistics are an exponential moving average over batches
  seen while the weights were still moving: after weight averaging (SWA), a
  change of data, or fine-tuning with tiny batches they describe another model;
- ``update_bn`` (momentum=None) averages the per-batch statistics with equal
  weight per batch. Its mean is the population mean only when every batch has
  the same size, and its variance -- the average of per-batch *unbiased*
  variances -- misses the spread of the batch means around the population mean
  (the between-batch term of the law of total variance), so it is low whenever
  batches differ, e.g. an unshuffled loader.

How: a forward pre-hook on each BatchNorm layer takes its input and reduces it
per channel to ``(count, mean, M2)`` -- M2 the sum of squared deviations from the
batch mean, by two passes in float64 -- and merges that into the layer's running
triple with Chan's parallel update::

    n = n_a + n_b,   delta = mean_b - mean_a
    mean = mean_a + delta * n_b / n
    M2   = M2_a + M2_b + delta^2 * n_a * n_b / n

which is exact (no E[x^2] - E[x]^2 cancellation) for any batch sizes. At the end
``running_mean = mean`` and ``running_var = M2 / (n - 1)`` (the unbiased
variance, as BatchNorm's own update uses), rounded once to the buffer's dtype.

During the pass the model runs in training mode, as ``update_bn`` runs it: each
BatchNorm normalises with its batch's statistics, so a later layer sees the
inputs it saw in training. ``num_batches_tracked`` is left as ``update_bn`` leaves
it: the number of batches the layer saw in the pass (for a GhostBatchNorm, the number of
virtual batches, which is what it counts). BatchRenorm and GhostBatchNorm are
recalibrated like BatchNorm (their eval is BatchNorm's eval with the running
statistics), except that a BatchRenorm keeps its ``num_batches_tracked``: that count is
the step of its r/d warm-up, which a recalibration does not move. Every module's train/eval
flag and each layer's ``momentum`` are restored; if a batch fails, every running
statistic is put back as it was. Frozen BatchNorm layers keep their statistics.

>>> import torch, normlab
>>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).eval()
>>> data = [torch.randn(8, 3) for _ in range(5)]
>>> model = normlab.recalibrate_batch_norm(model, data, progress=False)
>>> h = model[0](torch.cat(data)).detach()
>>> torch.allclose(model[1].running_var, h.var(0), atol=1e-5), model.training
(True, False)
"""

from __future__ import annotations

import itertools
import numbers
import warnings
from collections.abc import Callable, Iterable

import torch
from torch import nn

from .. import _extras
from ..nn.batch_renorm import _BatchRenorm
from .models import check_model
from .norm_layers import is_batch_norm

__all__ = ["recalibrate_batch_norm"]


def _sync_group(m):
    """The process group a SyncBatchNorm layer synchronises over (None: not one, or nothing to
    synchronise with). Every rank must then recalibrate with the same number of batches: the
    layer synchronises in the pass too."""
    from ..nn.sync_batch_norm import SyncBatchNorm

    return m._sync_group() if isinstance(m, SyncBatchNorm) else None


def _merge_moments(count, mean, m2, num_features, group):
    from ..functional.distributed import merge_moments

    return merge_moments(count, mean, m2, num_features, group)


class _Moments:
    """Per-channel ``(count, mean, M2)`` of everything seen so far, in float64."""

    def __init__(self) -> None:
        self.count = 0
        self.mean: torch.Tensor | None = None  # (C,) float64
        self.m2: torch.Tensor | None = None    # (C,) float64
        self.calls = 0

    def add(self, x: torch.Tensor) -> None:
        c = x.shape[1]
        n_b = x.numel() // c if c else 0
        if n_b == 0:
            return
        dims = [0, *range(2, x.dim())]
        x = x.detach().to(torch.float64)
        mean_b = x.mean(dims)                                                        # (C,)
        m2_b = (x - mean_b.view(1, c, *([1] * (x.dim() - 2)))).square().sum(dims)   # (C,)
        if self.count == 0:
            self.count, self.mean, self.m2 = n_b, mean_b, m2_b
            return
        n_a, n = self.count, self.count + n_b
        delta = mean_b - self.mean
        self.mean = self.mean + delta * (n_b / n)
        self.m2 = self.m2 + m2_b + delta.square() * (n_a * n_b / n)
        self.count = n


def _check_arguments(fn: str, model, batches, max_batches, forward) -> None:
    check_model(fn, model)
    if isinstance(batches, torch.Tensor) or not isinstance(batches, Iterable):
        raise TypeError(
            f"{fn}: expected batches to be an iterable of model inputs (a DataLoader, a list of "
            f"tensors, a generator), got {type(batches).__name__}"
            + ("; to use one tensor as one batch, pass [tensor]" if isinstance(batches, torch.Tensor) else "")
        )
    if max_batches is not None and (
        not isinstance(max_batches, numbers.Integral) or isinstance(max_batches, bool) or max_batches < 1
    ):
        raise ValueError(f"{fn}: expected max_batches to be a positive int or None, got {max_batches!r}")
    if forward is not None and not callable(forward):
        raise TypeError(f"{fn}: expected forward to be a callable forward(model, batch) or None, "
                        f"got {type(forward).__name__}")


class _NoBar:
    """The progress bar's interface, showing nothing (no bar asked for, or rich not installed)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def add_task(self, *args, **kwargs):
        return 0

    def advance(self, task):
        pass


def _progress(show: bool | None, total: int | None):
    if show is False:
        return _NoBar()
    try:
        _extras.require("rich", "normlab.recalibrate_batch_norm(progress=True)")
    except ModuleNotFoundError:
        if show:
            raise
        return _NoBar()  # the default shows a bar where rich (the experiments extra) is installed
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if show is None:
        show = console.is_terminal  # no bar in logs, pipes and CI
    columns = [TextColumn("recalibrating BatchNorm"), BarColumn()]
    columns.append(MofNCompleteColumn() if total is not None else TextColumn("{task.completed} batches"))
    return Progress(*columns, TimeElapsedColumn(), console=console, disable=not show, transient=False)


def _total(batches, max_batches) -> int | None:
    try:
        n = len(batches)
    except TypeError:  # a generator or an IterableDataset's loader: length unknown
        return max_batches
    return n if max_batches is None else min(n, max_batches)


def recalibrate_batch_norm(
    model: nn.Module,
    batches: Iterable,
    max_batches: int | None = None,
    forward: Callable | None = None,
    *,
    progress: bool | None = None,
) -> nn.Module:
    """Set every BatchNorm's running statistics to the exact mean and unbiased variance of its
    inputs over ``batches``; returns ``model``.

    ``running_mean = mean(x)``, ``running_var = sum((x - mean)^2) / (n - 1)`` over every sample
    and position of every batch a layer received, pooled as if they were one batch. Nearest
    torch counterpart: ``torch.optim.swa_utils.update_bn``, which averages per-batch statistics
    with equal weight per batch; its variance misses the spread of the batch means (low when
    batches differ) and its mean is off when batch sizes differ. Here the result does not
    depend on how the samples are split into batches.

    ``batches``: any iterable (a DataLoader included). A batch is passed to the model as
    ``model(batch)``, or ``model(batch[0])`` when it is a tuple or list (an
    ``(input, target)`` pair), unless ``forward(model, batch)`` is given, which then runs
    the model on a batch however it must (``forward=lambda m, b: m(**b)``).
    ``max_batches``: use at most this many batches. ``progress``: a rich progress bar
    over the batches on stderr (None: only when stderr is a terminal).

    Numerics: each batch reduced per channel to ``(count, mean, M2)`` in float64 (two passes),
    merged with Chan's formula, rounded once to the buffer's dtype. The pass runs in training
    mode (as ``update_bn``); every train/eval flag and ``momentum`` is restored, and
    ``num_batches_tracked`` is the number of batches seen. Layers without running statistics
    (``track_running_stats=False``) and layers no batch reached are left as they are, with a
    warning; a model with no BatchNorm gets a warning and is returned unchanged. An empty
    ``batches`` raises ``ValueError`` and changes nothing; a failing batch puts every
    statistic back.

    >>> import torch, normlab
    >>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).eval()
    >>> data = [torch.randn(n, 3) for n in (8, 2, 5)]  # batches of different sizes
    >>> model = normlab.recalibrate_batch_norm(model, data, progress=False)
    >>> h = model[0](torch.cat(data)).detach()
    >>> torch.allclose(model[1].running_mean, h.mean(0), atol=1e-6), torch.allclose(model[1].running_var, h.var(0), atol=1e-5)
    (True, True)
    """
    fn = "recalibrate_batch_norm"
    _check_arguments(fn, model, batches, max_batches, forward)
    layers, untracked = {}, []
    for name, m in model.named_modules():
        if is_batch_norm(m):
            if m.running_mean is None or m.running_var is None:
                untracked.append(name or "(the model)")
            else:
                layers[name] = m
    if not layers:
        what = (f"its BatchNorm layers {untracked} have track_running_stats=False, so no running statistics"
                if untracked else "it has no BatchNorm layer (frozen layers keep their statistics)")
        warnings.warn(f"{fn}: nothing to recalibrate: {what}", stacklevel=2)
        return model
    if untracked:
        warnings.warn(f"{fn}: {untracked} have track_running_stats=False (no running statistics) and are "
                      f"left as they are", stacklevel=2)

    moments = {name: _Moments() for name in layers}
    saved = {name: {k: m._buffers[k].clone() for k in ("running_mean", "running_var", "num_batches_tracked")
                    if m._buffers.get(k) is not None} for name, m in layers.items()}
    flags = [(m, m.training) for m in model.modules()]
    momenta = {name: m.momentum for name, m in layers.items()}

    def hook_for(name, bn):
        acc = moments[name]

        virtual = getattr(bn, "virtual_batch_size", None)  # GhostBatchNorm: a call is ceil(N / v) batches

        def pre_hook(module, args):
            x = args[0] if args else None
            acc.calls += 1 if virtual is None or not isinstance(x, torch.Tensor) else -(-x.shape[0] // virtual)
            # a malformed input is left to the layer itself to reject, with its own message
            if isinstance(x, torch.Tensor) and x.dim() >= 2 and x.shape[1] == bn.num_features:
                acc.add(x)
        return pre_hook

    handles = [m.register_forward_pre_hook(hook_for(name, m)) for name, m in layers.items()]
    done = False
    try:
        model.train()
        n_batches = 0
        with torch.no_grad(), _progress(progress, _total(batches, max_batches)) as bar:
            task = bar.add_task("batches", total=_total(batches, max_batches))
            stream = batches if max_batches is None else itertools.islice(batches, max_batches)
            for batch in stream:
                if forward is not None:
                    forward(model, batch)
                else:
                    model(batch[0] if isinstance(batch, (tuple, list)) else batch)
                n_batches += 1
                bar.advance(task)
        if n_batches == 0:
            raise ValueError(f"{fn}: batches yielded no batch; expected at least one model input "
                             f"(an empty DataLoader or list?). Nothing was changed")
        missed = []
        with torch.no_grad():
            for name, m in layers.items():
                acc = moments[name]
                group = _sync_group(m)
                if group is not None:  # SyncBatchNorm: every rank's moments pooled, one collective a layer
                    acc.count, acc.mean, acc.m2 = _merge_moments(acc.count, acc.mean, acc.m2, m.num_features,
                                                                 group)
                if acc.count == 0:
                    missed.append(name or "(the model)")
                    for k, v in saved[name].items():
                        m._buffers[k].copy_(v)  # the in-pass momentum updates, undone
                    continue
                m.running_mean.copy_(acc.mean)
                m.running_var.copy_(acc.m2 / max(acc.count - 1, 1))  # unbiased, as BatchNorm's update
                if isinstance(m, _BatchRenorm):  # its count is the training step of the warm-up: kept
                    m.num_batches_tracked.copy_(saved[name]["num_batches_tracked"])
                elif m._buffers.get("num_batches_tracked") is not None:
                    m.num_batches_tracked.fill_(acc.calls)
        done = True
    finally:
        for h in handles:
            h.remove()
        for m, flag in flags:
            m.training = flag
        for name, m in layers.items():
            m.momentum = momenta[name]
        if not done:  # a batch failed or there was none: every statistic back as it was
            with torch.no_grad():
                for name, m in layers.items():
                    for k, v in saved[name].items():
                        m._buffers[k].copy_(v)
    if missed:
        warnings.warn(f"{fn}: no batch reached {missed}; their running statistics are left as they were",
                      stacklevel=2)
    return model
