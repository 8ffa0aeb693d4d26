"""Swap torch.nn normalization modules for their normlab twins, and back.

``convert(model)`` replaces, in place, every module whose type is exactly one of
torch.nn's normalization classes with the normlab class of the same name. The
twin takes over the very same ``Parameter`` and buffer objects (so an optimizer
built before the swap keeps working), the train/eval flag and the module hooks.
Outputs do not change. ``revert(model)`` does the reverse.

Subclasses of torch.nn classes are left alone: their ``forward`` may do
something the twin does not. ``torch.nn.SyncBatchNorm`` and the ``Lazy*``
modules have no twin yet and are left alone too.

>>> import torch, normlab
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
>>> model = normlab.convert(model)
>>> type(model[1]).__module__.startswith("normlab")
True
"""

from __future__ import annotations

from typing import Callable

from torch import nn

from . import batch_norm as _bn
from . import group_norm as _gn
from . import layer_norm as _ln


def _has_bias(m) -> bool:
    # torch's ``bias`` argument only matters when there are affine parameters
    return m.bias is not None if m.weight is not None else True


def _layer_norm_args(m) -> dict:
    return dict(normalized_shape=m.normalized_shape, eps=m.eps,
                elementwise_affine=m.elementwise_affine, bias=_has_bias(m))


def _rms_norm_args(m) -> dict:
    return dict(normalized_shape=m.normalized_shape, eps=m.eps,
                elementwise_affine=m.elementwise_affine)


def _running_norm_args(m) -> dict:  # BatchNorm*d and InstanceNorm*d
    return dict(num_features=m.num_features, eps=m.eps, momentum=m.momentum, affine=m.affine,
                track_running_stats=m.track_running_stats, bias=_has_bias(m))


def _group_norm_args(m) -> dict:
    return dict(num_groups=m.num_groups, num_channels=m.num_channels, eps=m.eps,
                affine=m.affine, bias=_has_bias(m))


def _twins() -> list[tuple[type, type, Callable]]:
    pairs = [
        (nn.LayerNorm, _ln.LayerNorm, _layer_norm_args),
        (nn.RMSNorm, _ln.RMSNorm, _rms_norm_args),
        (nn.GroupNorm, _gn.GroupNorm, _group_norm_args),
    ]
    pairs += [(getattr(nn, n), getattr(_bn, n), _running_norm_args)
              for n in ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d")]
    pairs += [(getattr(nn, n), getattr(_gn, n), _running_norm_args)
              for n in ("InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d")]
    return pairs


_HOOK_DICTS = (
    "_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
    "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
    "_backward_pre_hooks", "_state_dict_hooks", "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks",
)


def _swap(old: nn.Module, new_cls: type, args: dict) -> nn.Module:
    new = new_cls(**args, device="meta")  # no memory: every tensor is replaced below
    for name in list(new._parameters):
        new._parameters[name] = old._parameters.get(name)
    for name in list(new._buffers):
        new._buffers[name] = old._buffers.get(name)
    new._non_persistent_buffers_set = set(old._non_persistent_buffers_set)
    for hooks in _HOOK_DICTS:
        if hasattr(old, hooks) and hasattr(new, hooks):
            setattr(new, hooks, getattr(old, hooks).copy())
    new.train(old.training)
    return new


def _replace_all(model: nn.Module, table: dict[type, tuple[type, Callable]]) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a torch.nn.Module, got {type(model).__name__}")
    if type(model) in table:  # the model is itself a norm layer: return its twin
        new_cls, args = table[type(model)]
        return _swap(model, new_cls, args(model))
    for parent in list(model.modules()):
        for name, child in list(parent._modules.items()):
            if child is not None and type(child) in table:
                new_cls, args = table[type(child)]
                parent._modules[name] = _swap(child, new_cls, args(child))
    return model


def convert(model: nn.Module) -> nn.Module:
    """Replace every torch.nn normalization module in ``model`` with its normlab twin, in place.

    Returns ``model`` (or the twin, when ``model`` itself is a normalization module).
    """
    return _replace_all(model, {t: (n, a) for t, n, a in _twins()})


def revert(model: nn.Module) -> nn.Module:
    """Replace every normlab normalization module in ``model`` with its torch.nn twin, in place."""
    return _replace_all(model, {n: (t, a) for t, n, a in _twins()})
