"""Swap torch.nn normalization modules for their normlab twins, and back.

``convert(model)`` replaces, in place, every module whose type is exactly one of
torch.nn's normalization classes with the normlab class of the same name -- and
the modules of the classes it has been taught: by :func:`register_conversion`,
or by the integrations for other libraries' norm classes (Hugging Face
transformers: ``hf.py``, timm: ``timm.py``), which register a finder here
and are imported only when convert meets a class of that library. The
twin takes over the very same ``Parameter`` and buffer objects (so an optimizer
built before the swap keeps working), the train/eval flag and the module hooks.
Outputs do not change. ``revert(model)`` does the reverse.

Subclasses of torch.nn classes are left alone: their ``forward`` may do
something the twin does not. ``torch.nn.SyncBatchNorm`` has no twin yet and is
left alone too. The ``Lazy*`` modules are converted once materialised: their
first call makes them torch's ``BatchNorm*``/``InstanceNorm*``, which convert
swaps; before it they are left alone (run the model once, then convert).

>>> import torch, normlab
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
>>> model = normlab.convert(model)
>>> type(model[1]).__module__.startswith("normlab")
True
"""

from __future__ import annotations

from typing import Callable

from torch import nn

from ..nn import batch_norm as _bn
from ..nn import group_norm as _gn
from ..nn import layer_norm as _ln
from ..nn import local_response_norm as _lrn
from .models import copy_hooks


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


def _lrn_args(m) -> dict:  # LocalResponseNorm and CrossMapLRN2d: no tensor at all
    return dict(size=m.size, alpha=m.alpha, beta=m.beta, k=m.k)


# twins that hold no tensor: built as they are (their constructors take no device)
_STATELESS = (nn.LocalResponseNorm, nn.CrossMapLRN2d, _lrn.LocalResponseNorm, _lrn.CrossMapLRN2d)


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
    pairs += [(getattr(nn, n), getattr(_lrn, n), _lrn_args) for n in ("LocalResponseNorm", "CrossMapLRN2d")]
    return pairs


def adopt(old: nn.Module, new_cls: type, **args) -> nn.Module:
    """``new_cls(**args)`` holding ``old``'s own ``Parameter`` and buffer objects of the same names.

    Built on the meta device (no memory: every tensor is replaced), so parameters the new
    module has and ``old`` lacks come out as None. The helper for a ``to_normlab`` /
    ``from_normlab`` function of :func:`register_conversion` whose two classes name their
    tensors alike (the ``state_dict`` keys then stay the same).
    """
    new = new_cls(**args, device="meta")
    for name in list(new._parameters):
        new._parameters[name] = old._parameters.get(name)
    for name in list(new._buffers):
        new._buffers[name] = old._buffers.get(name)
    new._non_persistent_buffers_set = set(old._non_persistent_buffers_set)
    return new


def _carry_over(old: nn.Module, new: nn.Module) -> nn.Module:
    """The module hooks and the train/eval flag of ``old``, on ``new``."""
    copy_hooks(old, new)
    new.train(old.training)
    return new


def _swap(old: nn.Module, new_cls: type, args: dict) -> nn.Module:
    if new_cls in _STATELESS:
        return _carry_over(old, new_cls(**args))
    return _carry_over(old, adopt(old, new_cls, **args))


# --------------------------------------------------------------------------
# Conversions of other classes: registered by users, or found by the integrations in
# normlab.tools (other libraries' norm classes, recognised when convert first meets them)
# --------------------------------------------------------------------------

_REGISTERED: dict[type, tuple[Callable, Callable]] = {}
_FINDERS: list[tuple[str, Callable]] = []  # (module prefix, find(cls) -> (to, from) or None)
_FOUND: dict[type, tuple[Callable, Callable] | None] = {}
_SOURCE = "_normlab_source"  # attribute of a converted module: the class it was converted from


def register_conversion(cls: type, to_normlab: Callable, from_normlab: Callable) -> None:
    """Teach :func:`convert` and :func:`revert` a norm class of your own.

    ``to_normlab(module)`` gets an instance of ``cls`` and returns the normlab module that
    computes the same thing (or None to leave that instance alone); ``from_normlab(twin)``
    gets that normlab module back and returns a ``cls`` instance. Both should hand over the
    very same ``Parameter`` objects under the same names, so an optimizer keeps working and
    ``state_dict`` keys do not change (:func:`adopt` does that when the names agree).
    ``convert`` carries the module hooks and the train/eval flag across; a registration
    replaces an earlier one for ``cls``, including what normlab knows of it.

    >>> import torch, normlab
    >>> class ScaleNorm(torch.nn.Module):  # RMSNorm under another name
    ...     def __init__(self, d, eps=1e-6, device=None):
    ...         super().__init__()
    ...         self.weight, self.eps = torch.nn.Parameter(torch.ones(d, device=device)), eps
    ...     def forward(self, x):
    ...         return torch.nn.functional.rms_norm(x, self.weight.shape, self.weight, self.eps)
    >>> normlab.register_conversion(
    ...     ScaleNorm,
    ...     lambda m: normlab.tools.conversion.adopt(m, normlab.nn.RMSNorm, normalized_shape=m.weight.shape, eps=m.eps),
    ...     lambda n: normlab.tools.conversion.adopt(n, ScaleNorm, d=n.normalized_shape[0], eps=n.eps))
    >>> model = normlab.convert(torch.nn.Sequential(ScaleNorm(4)))
    >>> type(model[0]).__name__, type(normlab.revert(model)[0]).__name__
    ('RMSNorm', 'ScaleNorm')
    """
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise TypeError(f"register_conversion: expected cls to be a torch.nn.Module subclass, got {cls!r}")
    for name, fn in (("to_normlab", to_normlab), ("from_normlab", from_normlab)):
        if not callable(fn):
            raise TypeError(f"register_conversion: expected {name} to be callable (a function of one module), "
                            f"got {type(fn).__name__}")
    _REGISTERED[cls] = (to_normlab, from_normlab)


def register_finder(module_prefix: str, find: Callable) -> None:
    """Let ``find(cls)`` say how to convert the classes defined in modules under ``module_prefix``
    (asked once per class, when convert or revert first meets it): ``(to_normlab, from_normlab)``
    or None. The integrations of ``normlab.tools`` register theirs; the library they know is
    never imported for it."""
    _FINDERS.append((module_prefix, find))
    _FOUND.clear()


def _conversion_for(cls: type):
    conv = _REGISTERED.get(cls)
    if conv is not None:
        return conv
    if cls not in _FOUND:
        module = getattr(cls, "__module__", "") or ""
        _FOUND[cls] = next((c for prefix, find in _FINDERS if module.startswith(prefix)
                            for c in [find(cls)] if c is not None), None)
    return _FOUND[cls]


def _replace_all(fn: str, model: nn.Module, replace: Callable) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise TypeError(f"{fn}: expected model to be a torch.nn.Module, got {type(model).__name__}")
    new = replace(model)
    if new is not None:  # the model is itself a norm layer: return its twin
        return new
    for parent in list(model.modules()):
        for name, child in list(parent._modules.items()):
            if child is not None:
                new = replace(child)
                if new is not None:
                    parent._modules[name] = new
    return model


def _checked(new, fn: str, cls: type):
    if new is not None and not isinstance(new, nn.Module):
        raise TypeError(f"{fn} for {cls.__name__} returned {type(new).__name__}, expected a torch.nn.Module "
                        f"(or None to leave the module as it is)")
    return new


def convert(model: nn.Module) -> nn.Module:
    """Replace every normalization module in ``model`` with its normlab twin, in place.

    Swapped: torch.nn's norm classes by exact type (LayerNorm, RMSNorm, GroupNorm,
    BatchNorm1d/2d/3d, InstanceNorm1d/2d/3d, LocalResponseNorm, CrossMapLRN2d; subclasses,
    ``SyncBatchNorm`` and the ``Lazy*`` modules before their first call are left alone -- after
    it they are BatchNorm*/InstanceNorm*, and swapped), the classes given to :func:`register_conversion`, and the norm
    classes of the libraries ``normlab.tools`` knows (Hugging Face transformers, timm). The twin
    takes over the very same ``Parameter`` and buffer objects (an optimizer built before keeps
    working; ``state_dict`` keys do not change), the train/eval flag and the module hooks;
    outputs do not change. No torch.nn counterpart. Returns ``model`` (or the twin, when
    ``model`` itself is a normalization module).

    >>> import torch, normlab
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    >>> w = model[1].weight
    >>> model = normlab.convert(model)
    >>> type(model[1]) is normlab.nn.LayerNorm, model[1].weight is w
    (True, True)
    """
    table = {t: (n, a) for t, n, a in _twins()}

    def replace(m):
        cls = type(m)
        if cls in table:
            new_cls, args = table[cls]
            return _swap(m, new_cls, args(m))
        conv = _conversion_for(cls)
        if conv is None:
            return None
        new = _checked(conv[0](m), "to_normlab", cls)
        if new is not None:
            _carry_over(m, new)
            new.__dict__[_SOURCE] = cls
        return new

    return _replace_all("convert", model, replace)


def revert(model: nn.Module) -> nn.Module:
    """Replace every normlab normalization module in ``model`` with the module it was converted
    from (the class it had, through its ``from_normlab``), or with its torch.nn twin, in place.

    The same ``Parameter`` and buffer objects, flags and hooks move back, as in :func:`convert`.
    An RMSNorm with ``casting`` or ``offset`` that ``torch.nn.RMSNorm`` cannot express, and that
    convert did not make, stays as it is; normlab layers without a torch.nn twin (LayerNorm2d,
    BatchRenorm, GhostBatchNorm, FrozenBatchNorm) stay too. Returns ``model`` (or the module
    that replaced it).

    >>> import torch, normlab
    >>> model = torch.nn.Sequential(normlab.nn.GroupNorm(2, 4))
    >>> type(normlab.revert(model)[0]) is torch.nn.GroupNorm
    True
    """
    table = {n: (t, a) for t, n, a in _twins()}

    def replace(m):
        source = m.__dict__.get(_SOURCE)
        if source is not None:
            conv = _conversion_for(source)
            if conv is not None:
                old = _checked(conv[1](m), "from_normlab", source)
                return None if old is None else _carry_over(m, old)
        cls = type(m)
        if cls not in table or (cls is _ln.RMSNorm and (m.casting != "torch" or m.offset != 0.0)):
            return None
        torch_cls, args = table[cls]
        return _swap(m, torch_cls, args(m))

    return _replace_all("revert", model, replace)
