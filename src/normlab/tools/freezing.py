"""Freeze a model's BatchNorm layers, and thaw them back.

``freeze_batch_norm(model)`` replaces, in place, every BatchNorm1d/2d/3d and
SyncBatchNorm (torch's or normlab's), and normlab's BatchRenorm1d/2d/3d and
GhostBatchNorm1d/2d/3d (whose eval is BatchNorm's eval with the running statistics),
with a ``normlab.nn.FrozenBatchNorm1d/2d/3d`` computing the eval formula with the
layer's current statistics and affine, in training and in eval alike. Setting ``requires_grad=False`` is not enough for
that: a BatchNorm in training mode still normalises with the batch's statistics
and still moves its running statistics. A frozen layer does neither, whatever
``model.train()`` says.

The frozen layer's buffers *share memory* with the BatchNorm's tensors (the
running statistics are the very same tensor objects; ``weight`` and ``bias`` are
detached views of the Parameters), and the BatchNorm module itself is kept
inside the frozen one. ``unfreeze_batch_norm(model)`` puts that module back --
its class, its constructor arguments, its Parameter objects (so an optimizer
built before freezing still holds them), its ``num_batches_tracked`` and its
hooks -- with whatever values the frozen buffers hold then (a checkpoint loaded
into the frozen model, a ``.to(device)`` or ``.half()`` in between) and the
frozen layer's train/eval flag.

>>> import torch, normlab
>>> model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
>>> normlab.freeze_batch_norm(model)[1]
FrozenBatchNorm2d(4, eps=1e-05)
>>> type(normlab.unfreeze_batch_norm(model)[1]).__name__
'BatchNorm2d'
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import torch
from torch import nn

from ..nn import batch_norm as _bn
from ..nn import frozen_batch_norm as _fbn
from .models import check_model, copy_hooks
from .norm_layers import batch_norm_rank, is_frozen

__all__ = ["freeze_batch_norm", "unfreeze_batch_norm"]

# Key, in a frozen layer's __dict__ (a plain attribute, not a submodule: it is not in
# state_dict, parameters() or modules()), of the BatchNorm module it replaced.
_ORIGINAL = "_normlab_unfrozen"

_FROZEN = {0: _fbn._FrozenBatchNorm, 1: _fbn.FrozenBatchNorm1d, 2: _fbn.FrozenBatchNorm2d,
           3: _fbn.FrozenBatchNorm3d}
_THAWED = {_fbn.FrozenBatchNorm1d: _bn.BatchNorm1d, _fbn.FrozenBatchNorm2d: _bn.BatchNorm2d,
           _fbn.FrozenBatchNorm3d: _bn.BatchNorm3d}


def _why_not_freezable(bn: nn.Module) -> str | None:
    rm = bn.running_mean
    if rm is None or bn.running_var is None:
        return "track_running_stats=False: there are no running statistics to freeze"
    if isinstance(rm, nn.parameter.UninitializedBuffer):
        return "a lazy layer not yet initialised: run one batch through the model first"
    return None


def _freeze(bn: nn.Module) -> nn.Module:
    rm, rv = bn.running_mean, bn.running_var
    frozen = _FROZEN[batch_norm_rank(bn)](bn.num_features, bn.eps, device="meta")
    # detach(): the same memory, without the Parameter's requires_grad; absent affine = identity
    weight = bn.weight.detach() if bn.weight is not None else torch.ones_like(rm)
    bias = bn.bias.detach() if bn.bias is not None else torch.zeros_like(rm)
    frozen._buffers.update(weight=weight, bias=bias, running_mean=rm, running_var=rv)
    copy_hooks(bn, frozen)
    frozen.train(bn.training)
    frozen.__dict__[_ORIGINAL] = bn
    return frozen


def _thaw(frozen: nn.Module, dropped: list[str]) -> nn.Module:
    bn = frozen.__dict__.get(_ORIGINAL)
    bufs = frozen._buffers
    if bn is None:  # built directly (or loaded), not by freeze_batch_norm: a fresh normlab layer
        cls = _THAWED.get(type(frozen))
        if cls is None:
            raise TypeError(f"unfreeze_batch_norm: {type(frozen).__name__} was not made by "
                            f"freeze_batch_norm and has no BatchNorm class to go back to")
        bn = cls(frozen.num_features, frozen.eps, device="meta")
        bn._parameters.update(weight=nn.Parameter(bufs["weight"]), bias=nn.Parameter(bufs["bias"]))
        bn._buffers["num_batches_tracked"] = torch.tensor(0, dtype=torch.long,
                                                          device=bufs["running_mean"].device)
    else:
        for name in ("weight", "bias"):
            p, buf = bn._parameters.get(name), bufs[name]
            if p is None:
                identity = torch.ones_like(buf) if name == "weight" else torch.zeros_like(buf)
                if not torch.equal(buf, identity):
                    dropped.append(name)
            elif not (p.data_ptr() == buf.data_ptr() and p.dtype == buf.dtype and p.device == buf.device):
                p.data = buf  # moved or cast since freezing: the Parameter object takes the new tensor
        nbt = bn._buffers.get("num_batches_tracked")
        if nbt is not None and nbt.device != bufs["running_mean"].device:
            bn._buffers["num_batches_tracked"] = nbt.to(bufs["running_mean"].device)
        bn.eps = frozen.eps
    bn._buffers["running_mean"] = bufs["running_mean"]
    bn._buffers["running_var"] = bufs["running_var"]
    copy_hooks(frozen, bn)
    bn.train(frozen.training)
    return bn


def _selected(fn: str, model: nn.Module, only) -> list[str] | None:
    """``only`` as a list of module names, each checked to exist; None for everything."""
    if only is None:
        return None
    names = [only] if isinstance(only, str) else only
    if not isinstance(names, Iterable) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"{fn}: expected only to be a module name or a list of module names "
                        f"(as in model.named_modules()), got {only!r}")
    names = list(names)
    known = dict(model.named_modules())
    missing = [n for n in names if n not in known]
    if missing:
        bns = [n for n, m in known.items() if batch_norm_rank(m) is not None]
        raise ValueError(f"{fn}: no module named {missing} in the model; its BatchNorm layers are "
                         f"{bns[:20]}{' ...' if len(bns) > 20 else ''} (a name also selects every "
                         f"module under it, e.g. 'backbone')")
    return names


def _replace(model: nn.Module, table: dict[int, nn.Module]) -> nn.Module:
    """Put ``table[id(old)]`` wherever ``old`` is a child (a shared module: every place)."""
    if id(model) in table:
        return table[id(model)]
    for parent in list(model.modules()):
        for name, child in list(parent._modules.items()):
            if child is not None and id(child) in table:
                parent._modules[name] = table[id(child)]
    return model


def freeze_batch_norm(model: nn.Module, only: str | Iterable[str] | None = None) -> nn.Module:
    """Replace BatchNorm layers with ``FrozenBatchNorm1d/2d/3d``, in place, keeping their values.

    Each frozen layer computes ``y = (x - running_mean) / sqrt(running_var + eps) * weight + bias``
    with the layer's current statistics and affine in training and in eval alike: no statistic
    is computed or updated, whatever ``model.train()`` says (``requires_grad=False`` alone does
    not give that). Its buffers share memory with the BatchNorm's tensors. Taken: BatchNorm1d/2d/3d
    and SyncBatchNorm (torch's or normlab's), BatchRenorm and GhostBatchNorm. No torch.nn
    counterpart (torchvision has the layer, ``torchvision.ops.FrozenBatchNorm2d``, but no swap).

    ``only``: a module name or list of names (as in ``model.named_modules()``); each
    selects that module and every module under it. None: every BatchNorm.
    A BatchNorm without running statistics (``track_running_stats=False``) cannot be
    frozen: it is skipped with a warning, or an error when ``only`` names it.
    Returns ``model`` (or the frozen layer, when ``model`` is itself a BatchNorm).

    >>> import torch, normlab
    >>> model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).train()
    >>> normlab.freeze_batch_norm(model)[1]
    FrozenBatchNorm2d(4, eps=1e-05)
    >>> _ = model(torch.randn(2, 3, 5, 5))
    >>> model[1].running_mean  # training mode, yet nothing moved
    tensor([0., 0., 0., 0.])
    """
    fn = "freeze_batch_norm"
    check_model(fn, model)
    names = _selected(fn, model, only)
    todo, skipped = {}, []
    for name, m in model.named_modules():
        if batch_norm_rank(m) is None:
            continue
        if names is not None and not any(n == "" or name == n or name.startswith(n + ".") for n in names):
            continue
        why = _why_not_freezable(m)
        if why is None:
            todo[id(m)] = m
        elif names is not None and name in names:
            raise ValueError(f"{fn}: cannot freeze {name!r} ({type(m).__name__}): {why}")
        else:
            skipped.append(f"{name or '(the model)'}: {why}")
    if skipped:
        warnings.warn(f"{fn}: left {len(skipped)} BatchNorm layer(s) as they are: " + "; ".join(skipped),
                      stacklevel=2)
    if not todo and not skipped:
        where = "" if names is None else f" under {names}"
        warnings.warn(f"{fn}: found no BatchNorm layer{where}; nothing was frozen", stacklevel=2)
    return _replace(model, {k: _freeze(m) for k, m in todo.items()})


def unfreeze_batch_norm(model: nn.Module) -> nn.Module:
    """Swap every frozen layer back to the BatchNorm it was made from, in place.

    The very module ``freeze_batch_norm`` replaced comes back (class, constructor
    arguments, Parameter objects, ``num_batches_tracked``, hooks) holding the
    frozen layer's current values and train/eval flag. A frozen layer built
    directly becomes a ``normlab.nn.BatchNorm1d/2d/3d`` with its values (and new
    Parameters, ``num_batches_tracked=0``). Returns ``model`` (or the BatchNorm,
    when ``model`` is itself a frozen layer).

    >>> import torch, normlab
    >>> model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    >>> bn = model[1]
    >>> normlab.unfreeze_batch_norm(normlab.freeze_batch_norm(model))[1] is bn
    True
    """
    check_model("unfreeze_batch_norm", model)
    names = {}
    for name, m in model.named_modules():
        if is_frozen(m):
            names.setdefault(id(m), (name, m))
    table, notes = {}, []
    for k, (name, m) in names.items():
        dropped = []
        table[k] = _thaw(m, dropped)
        if dropped:
            notes.append(f"{name or '(the model)'}: {' and '.join(dropped)}")
    if notes:
        warnings.warn("unfreeze_batch_norm: these frozen layers hold an affine weight/bias that is not the "
                      "identity, but the BatchNorm they came from has none (affine=False), so the values are "
                      "dropped: " + "; ".join(notes), stacklevel=2)
    return _replace(model, table)
