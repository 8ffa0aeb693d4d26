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

``convert(model, to="dyt")`` swaps the LayerNorms and RMSNorms instead for
``normlab.nn.DyT`` (Zhu et al., "Transformers without Normalization", CVPR 2025):
outputs change (a different layer), ``revert`` gives the norms back
(``docs/derivations/dyt.md``, "Converting a model").

>>> import torch, normlab
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
>>> model = normlab.convert(model)
>>> type(model[1]).__module__.startswith("normlab")
True
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Callable

import torch
from torch import nn

from ..nn import batch_norm as _bn
from ..nn import dyt as _dyt
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
    new = replace(model, "")
    if new is not None:  # the model is itself a norm layer: return its twin
        return new
    for prefix, parent in list(model.named_modules()):
        for name, child in list(parent._modules.items()):
            if child is not None:
                new = replace(child, f"{prefix}.{name}" if prefix else name)
                if new is not None:
                    parent._modules[name] = new
    return model


def _checked(new, fn: str, cls: type):
    if new is not None and not isinstance(new, nn.Module):
        raise TypeError(f"{fn} for {cls.__name__} returned {type(new).__name__}, expected a torch.nn.Module "
                        f"(or None to leave the module as it is)")
    return new

# --------------------------------------------------------------------------
# to="dyt": LayerNorm / RMSNorm -> DyT, and back
# --------------------------------------------------------------------------

TARGETS = ("normlab", "dyt")
DYT_ALPHA_INIT = 0.5  # the paper's default (Section 7)
_DYT_SOURCE = "_normlab_dyt_source"  # on a DyT made by convert: (the norm it replaced, offset, alpha_init)


def _as_norm_twin(m: nn.Module):
    """``m`` as a normlab LayerNorm / RMSNorm computing the same thing, or None (not one, or one
    over other dims: LayerNorm2d)."""
    cls = type(m)
    if cls in (_ln.LayerNorm, _ln.RMSNorm):
        return m
    if cls is nn.LayerNorm:
        return adopt(m, _ln.LayerNorm, **_layer_norm_args(m))
    if cls is nn.RMSNorm:
        return adopt(m, _ln.RMSNorm, **_rms_norm_args(m))
    if cls in (t for t, _, _ in _twins()):  # BatchNorm, GroupNorm, InstanceNorm: not DyT's place
        return None
    conv = _conversion_for(cls)
    if conv is None:
        return None
    twin = _checked(conv[0](m), "to_normlab", cls)
    return twin if type(twin) in (_ln.LayerNorm, _ln.RMSNorm) else None


def _alpha_value(alpha_init, name: str, m: nn.Module) -> float:
    a = alpha_init(name, m) if callable(alpha_init) else alpha_init
    if not isinstance(a, numbers.Real) or isinstance(a, bool) or not math.isfinite(a):
        where = f" (alpha_init({name!r}, {type(m).__name__}) returned it)" if callable(alpha_init) else ""
        raise (TypeError if not isinstance(a, numbers.Real) or isinstance(a, bool) else ValueError)(
            f"convert: expected alpha_init to be a finite float, got {a!r}{where}; the paper's default is "
            f"{DYT_ALPHA_INIT}")
    return float(a)


def _to_dyt_replacer(alpha_init):
    if alpha_init is None:
        alpha_init = DYT_ALPHA_INIT
    if not callable(alpha_init):
        _alpha_value(alpha_init, "", nn.Module())  # checked before any work

    def replace(m, name):
        twin = _as_norm_twin(m)
        if twin is None:
            return None
        a = _alpha_value(alpha_init, name, m)
        w, b = twin._parameters.get("weight"), twin._parameters.get("bias")
        offset = float(getattr(twin, "offset", 0.0))
        ref = next(iter([*m.parameters(recurse=False), *m.buffers(recurse=False)]), None)
        kw = {} if ref is None else dict(device=ref.device, dtype=ref.dtype)
        dyt = _dyt.DyT(twin.normalized_shape, alpha_init=a, elementwise_affine=w is not None,
                       bias=b is not None, **kw)
        if w is not None:
            dyt.weight = w if offset == 0.0 else nn.Parameter(w.detach() + offset, requires_grad=w.requires_grad)
        if b is not None:
            dyt.bias = b
        dyt.__dict__[_DYT_SOURCE] = (m, offset, a)
        return _carry_over(m, dyt)

    return replace


def _from_dyt(dyt: nn.Module, name: str) -> nn.Module:
    old, offset, a0 = dyt.__dict__[_DYT_SOURCE]
    alpha = dyt.alpha.detach()
    if alpha.numel() == 1 and float(alpha) != float(torch.tensor(a0, dtype=alpha.dtype)):
        warnings.warn(f"revert: the DyT at {name or 'the top'!r} has alpha = {float(alpha):.6g}, moved from the "
                      f"{a0:g} convert gave it; the {type(old).__name__} it goes back to has no alpha, so it is "
                      f"dropped and the layer computes something else than the one trained", UserWarning,
                      stacklevel=3)
    for pname, off in (("weight", offset), ("bias", 0.0)):
        p, q = dyt._parameters.get(pname), old._parameters.get(pname)
        if p is None or q is None or p is q:
            continue
        old._parameters[pname] = nn.Parameter(p.detach() - off if off else p.detach().clone(),
                                              requires_grad=p.requires_grad)
    del dyt.__dict__[_DYT_SOURCE]
    return _carry_over(dyt, old)


def convert(model: nn.Module, to: str = "normlab", *, alpha_init=None) -> nn.Module:
    """Replace every normalization module in ``model`` with its normlab twin, in place
    (``to="normlab"``, the default), or every LayerNorm and RMSNorm with a DyT (``to="dyt"``).

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

    ``to="dyt"``: every LayerNorm and RMSNorm -- torch.nn's, normlab's, and the Hugging Face
    and timm classes that convert knows (a channels-first LayerNorm2d excepted) -- becomes a
    ``normlab.nn.DyT`` with the same ``normalized_shape`` and affine/bias flags, holding the
    norm's very ``weight`` and ``bias`` Parameters (a norm without bias gives a DyT without
    bias; an RMSNorm has none; a Gemma-style ``1 + weight`` scale gives a DyT weight of
    ``1 + weight``, a new Parameter), on the norm's device and dtype, with a new ``alpha``.
    ``eps`` has no place in DyT. BatchNorm, GroupNorm and InstanceNorm are left untouched
    (the paper replaces LayerNorm and RMSNorm only), as are modules convert does not know.
    The outputs change: DyT is another layer, not a twin. ``alpha_init``: the paper's
    default 0.5 (its Section 7, "Initialization of alpha": non-LLM Transformers are
    insensitive to it and 0.5 serves them all); a float for every DyT, or a function
    ``alpha_init(name, module) -> float`` of each norm's qualified name and module, for
    LLMs, whose best alpha_init the paper finds depends on the width and differs between
    the norm before attention and the others (FFN and final norm): LLaMA 2 7B (width
    4096): 0.8 and 0.2; 13B (5120): 0.6 and 0.15; 34B and 70B (8192): 0.2 and 0.05.
    :func:`revert` gives the norms back.

    >>> model = normlab.convert(torch.nn.Sequential(torch.nn.LayerNorm(4)), to="dyt")
    >>> model[0]
    DyT((4,), alpha_init=0.5, elementwise_affine=True, bias=True)
    """

    if to not in TARGETS:
        raise ValueError(f"convert: expected to to be one of {', '.join(map(repr, TARGETS))}, got {to!r}")
    if to == "dyt":
        return _replace_all("convert", model, _to_dyt_replacer(alpha_init))
    if alpha_init is not None:
        raise ValueError(f"convert: alpha_init={alpha_init!r} is DyT's, given with to={to!r}; pass to=\"dyt\" "
                         f"or leave alpha_init out")
    table = {t: (n, a) for t, n, a in _twins()}

    def replace(m, name):
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

    A DyT that ``convert(model, to="dyt")`` made goes back to the norm it replaced, of the same
    class, ``eps`` and flags (a normlab LayerNorm or RMSNorm then goes on to its torch.nn class,
    as every normlab twin does here), with the DyT's
    current ``weight`` and ``bias`` (the same Parameters where the DyT held the norm's own;
    else new ones: ``weight - 1`` for a Gemma-style norm). ``alpha`` has no place in a
    LayerNorm or RMSNorm and is dropped: when it has moved from the value convert gave it
    (training changed it), revert warns (UserWarning), for the layer is then no longer what
    was trained. A DyT that convert did not make stays.

    >>> import torch, normlab
    >>> model = torch.nn.Sequential(normlab.nn.GroupNorm(2, 4))
    >>> type(normlab.revert(model)[0]) is torch.nn.GroupNorm
    True
    """
    table = {n: (t, a) for t, n, a in _twins()}

    def replace(m, name):
        if type(m) is _dyt.DyT and _DYT_SOURCE in m.__dict__:
            old = _from_dyt(m, name)
            return replace(old, name) or old  # a normlab twin it came from goes on back
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
