"""timm's norm classes as normlab modules: what ``normlab.convert`` knows of them.

Imported only when ``convert`` or ``revert`` first meets a class defined in a ``timm``
module (``tools/integrations.py`` registers the finder), so ``import normlab`` never
imports timm, and this module does not either: a class is recognised by where it is
defined (module ``timm.layers.norm``, ``.evo_norm``, ``.filter_response_norm``), its name and its base class, and each instance
by the attributes its ``forward`` reads. (By name rather than by its code, as
``tools/hf.py`` does for transformers: timm cannot be installed beside every torch --
its torchvision dependency is built for one torch release -- so the code is not there
to compare with in every environment normlab is tested in.)

================  ================  ================================================  ================
timm class        base              its forward (timm 1.0)                            normlab module
================  ================  ================================================  ================
``LayerNorm``     ``nn.LayerNorm``  ``F.layer_norm(x, normalized_shape, w, b, eps)``  ``LayerNorm``
``LayerNorm2d``   ``nn.LayerNorm``  the same over dim 1: permute (0, 2, 3, 1),        ``LayerNorm2d``
                                    ``F.layer_norm``, permute back
``RmsNorm``       ``nn.Module``     ``F.rms_norm(x, normalized_shape, w, eps)``       ``RMSNorm``
``RmsNorm2d``     ``nn.Module``     ``x * rsqrt(mean_C(x^2) + eps) * w`` over dim 1   ``RmsNorm2d``
``SimpleNorm``    ``nn.Module``     ``x * rsqrt(var(x) + eps) * w`` (``torch.var``,   ``SimpleNorm``
                                    unbiased) over ``normalized_shape``
``SimpleNorm2d``  ``nn.Module``     the same over dim 1, by permuting                 ``SimpleNorm2d``
================  ================  ================================================  ================

eps defaults to 1e-6 in these and is read from the module. From ``timm.layers.evo_norm`` and
``timm.layers.filter_response_norm`` (base ``nn.Module``; the attributes their forward reads:
``eps``, ``weight``, ``bias`` and)

- ``EvoNorm2dB0`` (``v``, ``momentum``, the buffer ``running_var``; ``v`` None: the affine alone)
  becomes ``normlab.nn.EvoNorm2dB0``; ``EvoNorm2dS0`` (``v``, ``groups``) ``normlab.nn.EvoNorm2dS0``;
- ``FilterResponseNormTlu2d`` (``tau``, None without the TLU) becomes
  ``normlab.nn.FilterResponseNormTlu2d``; ``FilterResponseNormAct2d`` (its activation module
  ``act``) ``normlab.nn.FilterResponseNormAct2d`` holding that very ``act`` module (so an
  activation with parameters, a PReLU, keeps its ``act.weight``).

An instance whose ``_fast_norm`` flag is set (``timm.layers.set_fast_norm()``: under autocast it computes
in the autocast dtype, or with apex) is left alone, as is a ``LayerNorm2d`` with a
weight and no bias (``normlab.nn.LayerNorm2d`` has both or neither). The twin holds the
very same ``Parameter`` objects under the same names (``state_dict`` keys unchanged);
the original module rides along on it (a plain attribute, no ``state_dict`` entry), and
``revert`` gives it back with the twin's current parameters, buffers, activation module, ``eps``
(and ``momentum``). The outputs
agree in value and in layout: timm's ``LayerNorm2d`` and ``LayerNormAct2d`` return the
permuted result of ``F.layer_norm`` (channels_last strides for an NCHW input), and so do their
twins (``channels_last_output = True``; a contiguous bfloat16 output made the 1x1 convolutions
after a ConvNeXt block's norm 2.4x slower); timm's ``SimpleNorm2d``, elementwise ops on the
permuted view, keeps the input's layout, as normlab's does. normlab's statistics are float32 (float64 for float64 input) where timm's
RmsNorm2d and SimpleNorm(2d) compute in the input's dtype: bfloat16 outputs differ by rounding.
"""

from __future__ import annotations

import numbers

from torch import nn

from .conversion import adopt
from ..nn.evo_norm import EvoNorm2dB0, EvoNorm2dS0
from ..nn.frn import FilterResponseNormAct2d, FilterResponseNormTlu2d
from ..nn.layer_norm import LayerNorm, LayerNorm2d, RMSNorm
from ..nn.scale_norm import RmsNorm2d, SimpleNorm, SimpleNorm2d
from ..nn import norm_act as na
from ..nn._activations import act_of

MODULE = "timm.layers.norm"
# class name -> (the module timm defines it in, the base class timm derives it from)
CLASSES = {
    "LayerNorm": (MODULE, nn.LayerNorm), "LayerNorm2d": (MODULE, nn.LayerNorm), "RmsNorm": (MODULE, nn.Module),
    "RmsNorm2d": (MODULE, nn.Module), "SimpleNorm": (MODULE, nn.Module), "SimpleNorm2d": (MODULE, nn.Module),
    "EvoNorm2dB0": ("timm.layers.evo_norm", nn.Module), "EvoNorm2dS0": ("timm.layers.evo_norm", nn.Module),
    "FilterResponseNormTlu2d": ("timm.layers.filter_response_norm", nn.Module),
    "FilterResponseNormAct2d": ("timm.layers.filter_response_norm", nn.Module),
}
_ROW_KINDS = ("LayerNorm", "LayerNorm2d", "RmsNorm")
_ORIGINAL = "_normlab_original"  # the converted module, kept on its twin for revert


def kind_of(cls: type) -> str | None:
    """The class's name (``"LayerNorm"``, ``"EvoNorm2dB0"``, ...) for the timm classes above, else None."""
    if not isinstance(cls, type):
        return None
    where = CLASSES.get(cls.__qualname__)
    if where is None or cls.__module__ != where[0] or cls.__bases__ != (where[1],):
        return None
    return cls.__qualname__


def conversion_for(cls: type):
    """``(to_normlab, from_normlab)`` for a timm norm class, or None (the finder)."""
    kind = kind_of(cls)
    if kind is None:
        return norm_act_conversion_for(cls)
    return to_normlab, from_normlab


def _param(m: nn.Module, name: str):
    """``m``'s Parameter ``name``, None when absent; False when it is something else."""
    p = m._parameters.get(name)
    return p if p is None or isinstance(p, nn.Parameter) else False


def to_normlab(m: nn.Module) -> nn.Module | None:
    """The normlab module computing what ``m`` computes, with ``m``'s own parameters (None: left alone)."""
    kind = type(m).__qualname__
    if kind not in _ROW_KINDS:
        twin = _other_to_normlab(kind, m)
        if twin is not None:
            twin.__dict__[_ORIGINAL] = m
        return twin
    shape = getattr(m, "normalized_shape", None)
    eps = getattr(m, "eps", None)
    w, b = _param(m, "weight"), _param(m, "bias")
    if getattr(m, "_fast_norm", False) or len(m._buffers) or w is False or b is False \
            or not isinstance(shape, tuple) or not isinstance(eps, numbers.Real):
        return None
    if w is not None and tuple(w.shape) != shape:
        return None
    if kind == "LayerNorm":
        twin = adopt(m, LayerNorm, normalized_shape=shape, eps=float(eps), elementwise_affine=w is not None,
                     bias=b is not None or w is None)
    elif kind == "LayerNorm2d":
        if len(shape) != 1 or (w is None) != (b is None):
            return None
        twin = adopt(m, LayerNorm2d, num_channels=shape[0], eps=float(eps), affine=w is not None)
        twin.channels_last_output = True  # timm's permuted result: the next layers keep their kernels
    else:  # RmsNorm
        if b is not None:
            return None
        twin = adopt(m, RMSNorm, normalized_shape=shape, eps=float(eps), elementwise_affine=w is not None,
                     dtype=None if w is None else w.dtype)
    twin.__dict__[_ORIGINAL] = m  # a plain attribute: no submodule, no state_dict entry
    return twin


def from_normlab(twin: nn.Module) -> nn.Module | None:
    """The timm module ``twin`` was converted from, holding ``twin``'s parameters and ``eps``
    (None -- the twin stays -- when it holds none, as a twin built elsewhere)."""
    old = twin.__dict__.get(_ORIGINAL)
    if old is None or kind_of(type(old)) is None:
        return None
    for name, p in twin._parameters.items():  # the twin's Parameters (a .to() may have made new ones)
        old._parameters[name] = p
    for name, t in twin._buffers.items():
        old._buffers[name] = t
    if "act" in twin._modules:
        old._modules["act"] = twin._modules["act"]
    old.eps = twin.eps
    if hasattr(twin, "momentum"):
        old.momentum = twin.momentum
    return old


def _per_channel(m: nn.Module, names) -> int | None:
    """The channel count when each of ``m``'s Parameters ``names`` (None allowed after the first) is
    a 1-D Parameter of one length and ``m.eps`` a number; else None."""
    ps = [_param(m, n) for n in names]
    if ps[0] is None or any(p is False for p in ps) or not isinstance(getattr(m, "eps", None), numbers.Real):
        return None
    c = ps[0].shape
    if len(c) != 1 or any(p is not None and p.shape != c for p in ps):
        return None
    return c[0]


def _other_to_normlab(kind: str, m: nn.Module) -> nn.Module | None:
    """The twins of timm's RmsNorm2d, SimpleNorm(2d), EvoNorm2dB0/S0 and FilterResponseNorm*2d."""
    eps = getattr(m, "eps", None)
    if kind in ("RmsNorm2d", "SimpleNorm", "SimpleNorm2d"):
        shape, w = getattr(m, "normalized_shape", None), _param(m, "weight")
        if getattr(m, "_fast_norm", False) or len(m._buffers) or w is False or "bias" in m._parameters \
                or not isinstance(shape, tuple) or not isinstance(eps, numbers.Real) \
                or (w is not None and tuple(w.shape) != shape):
            return None
        if kind == "SimpleNorm":
            return adopt(m, SimpleNorm, channels=shape, eps=float(eps), affine=w is not None)
        if len(shape) != 1:
            return None
        cls = RmsNorm2d if kind == "RmsNorm2d" else SimpleNorm2d
        return adopt(m, cls, channels=shape[0], eps=float(eps), affine=w is not None)
    if kind.startswith("FilterResponseNorm"):
        act = m._modules.get("act")
        c = _per_channel(m, ("weight", "bias", "tau"))
        if c is None or len(m._buffers) or not isinstance(getattr(m, "rms", True), bool):
            return None
        if kind == "FilterResponseNormTlu2d":
            return adopt(m, FilterResponseNormTlu2d, num_features=c, apply_act=_param(m, "tau") is not None,
                         eps=float(eps), rms=getattr(m, "rms", True))
        if not isinstance(act, nn.Module) or "tau" in m._parameters:
            return None
        twin = adopt(m, FilterResponseNormAct2d, num_features=c, act_layer=None, eps=float(eps),
                     rms=getattr(m, "rms", True))
        twin._modules["act"] = act  # timm's own activation module: its parameters and state_dict keys
        return twin
    c = _per_channel(m, ("weight", "bias", "v"))
    if c is None:
        return None
    apply_act = _param(m, "v") is not None
    if kind == "EvoNorm2dB0":
        momentum, rv = getattr(m, "momentum", None), m._buffers.get("running_var")
        if not isinstance(momentum, numbers.Real) or not 0 <= momentum <= 1 or rv is None \
                or tuple(rv.shape) != (c,) or set(m._buffers) != {"running_var"}:
            return None
        return adopt(m, EvoNorm2dB0, num_features=c, apply_act=apply_act, momentum=float(momentum), eps=float(eps))
    groups = getattr(m, "groups", None)
    if len(m._buffers) or not isinstance(groups, int) or groups < 1 or (apply_act and c % groups):
        return None
    return adopt(m, EvoNorm2dS0, num_features=c, groups=groups, apply_act=apply_act, eps=float(eps))

# -- timm's norm + activation classes (timm.layers.norm_act) -------------------------------------
#
# ========================  ==================  =======================================  ========================
# timm class                base                its forward: the norm, then drop, act    normlab module
# ========================  ==================  =======================================  ========================
# ``BatchNormAct2d``        ``nn.BatchNorm2d``  ``F.batch_norm`` (momentum, running      ``BatchNormAct2d``
#                                               statistics, num_batches_tracked)
# ``FrozenBatchNormAct2d``  ``nn.Module``       x * scale + shift from 4 buffers         ``FrozenBatchNormAct2d``
# ``GroupNormAct``          ``nn.GroupNorm``    ``F.group_norm``                         ``GroupNormAct``
# ``LayerNormAct``          ``nn.LayerNorm``    ``F.layer_norm``                         ``LayerNormAct``
# ``LayerNormAct2d``        ``nn.LayerNorm``    permute, ``F.layer_norm``, permute back  ``LayerNormAct2d``
# ========================  ==================  =======================================  ========================
#
# The twin holds the very Parameters and buffers (state_dict keys unchanged) and the very ``act``
# and ``drop`` Modules; an ``act`` the fused kernels do not know (``normlab.nn._activations``), a
# ``_fast_norm`` instance, or a LayerNormAct2d with a weight and no bias is left alone.

NORM_ACT_MODULE = "timm.layers.norm_act"
NORM_ACT_CLASSES = {"BatchNormAct2d": nn.BatchNorm2d, "FrozenBatchNormAct2d": nn.Module,
                    "GroupNormAct": nn.GroupNorm, "LayerNormAct": nn.LayerNorm, "LayerNormAct2d": nn.LayerNorm}


def norm_act_kind_of(cls: type) -> str | None:
    """The timm norm+act class name (``"BatchNormAct2d"``, ...) for those classes, else None."""
    if not isinstance(cls, type) or cls.__module__ != NORM_ACT_MODULE:
        return None
    base = NORM_ACT_CLASSES.get(cls.__qualname__)
    if base is None or cls.__bases__ != (base,):
        return None
    return cls.__qualname__


def norm_act_conversion_for(cls: type):
    """``(to_normlab, from_normlab)`` for a timm norm+act class, or None."""
    if norm_act_kind_of(cls) is None:
        return None
    return norm_act_to_normlab, norm_act_from_normlab


def _real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def norm_act_to_normlab(m: nn.Module) -> nn.Module | None:
    """The normlab norm+act module computing what ``m`` computes, with ``m``'s own tensors, ``act``
    and ``drop`` (None: left alone)."""
    kind = type(m).__qualname__
    act, drop, eps = m._modules.get("act"), m._modules.get("drop"), getattr(m, "eps", None)
    if act is None or drop is None or act_of(act) is None or not _real(eps) or getattr(m, "_fast_norm", False):
        return None
    w, b = _param(m, "weight"), _param(m, "bias")
    if w is False or b is False:
        return None
    if kind == "BatchNormAct2d":
        momentum = m.momentum
        if not (momentum is None or _real(momentum)) or set(m._modules) != {"act", "drop"}:
            return None
        twin = adopt(m, na.BatchNormAct2d, num_features=m.num_features, eps=float(eps), momentum=momentum,
                     affine=m.affine, track_running_stats=m.track_running_stats)
    elif kind == "FrozenBatchNormAct2d":
        if set(m._buffers) != {"weight", "bias", "running_mean", "running_var"} or len(m._parameters):
            return None
        twin = adopt(m, na.FrozenBatchNormAct2d, num_features=m.weight.shape[0], eps=float(eps))
    elif kind == "GroupNormAct":
        if len(m._buffers) or (w is None) != (b is None):
            return None
        twin = adopt(m, na.GroupNormAct, num_channels=m.num_channels, num_groups=m.num_groups, eps=float(eps),
                     affine=w is not None)
    else:
        shape = getattr(m, "normalized_shape", None)
        if len(m._buffers) or not isinstance(shape, tuple) or (w is not None and tuple(w.shape) != shape):
            return None
        if kind == "LayerNormAct":
            twin = adopt(m, na.LayerNormAct, normalization_shape=shape, eps=float(eps), affine=w is not None,
                         bias=b is not None or w is None)
        else:
            if len(shape) != 1 or (w is None) != (b is None):
                return None
            twin = adopt(m, na.LayerNormAct2d, num_channels=shape[0], eps=float(eps), affine=w is not None)
            twin.channels_last_output = True
    twin.drop, twin.act = drop, act
    twin.__dict__[_ORIGINAL] = m
    return twin


def norm_act_from_normlab(twin: nn.Module) -> nn.Module | None:
    """The timm module ``twin`` was converted from, holding ``twin``'s tensors, ``eps`` (and
    ``momentum``), ``act`` and ``drop``."""
    old = twin.__dict__.get(_ORIGINAL)
    if old is None or norm_act_kind_of(type(old)) is None:
        return None
    for name, p in twin._parameters.items():
        old._parameters[name] = p
    for name, t in twin._buffers.items():
        if name in old._buffers:
            old._buffers[name] = t
    old.eps = twin.eps
    if hasattr(twin, "momentum") and hasattr(old, "momentum"):
        old.momentum = twin.momentum
    old.act, old.drop = twin.act, twin.drop
    return old
