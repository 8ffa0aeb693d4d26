"""timm's norm classes as normlab modules: what ``normlab.convert`` knows of them.

Imported only when ``convert`` or ``revert`` first meets a class defined in a ``timm``
module (``tools/integrations.py`` registers the finder), so ``import normlab`` never
imports timm, and this module does not either: a class is recognised by where it is
defined (module ``timm.layers.norm``), its name and its base class, and each instance
by the attributes its ``forward`` reads. (By name rather than by its code, as
``tools/hf.py`` does for transformers: timm cannot be installed beside every torch --
its torchvision dependency is built for one torch release -- so the code is not there
to compare with in every environment normlab is tested in.)

==============  ==================  =================================================  ===================
timm class      base                its forward (timm 1.0)                             normlab module
==============  ==================  =================================================  ===================
``LayerNorm``   ``nn.LayerNorm``    ``F.layer_norm(x, normalized_shape, w, b, eps)``   ``LayerNorm``
``LayerNorm2d`` ``nn.LayerNorm``    the same over dim 1: permute (0, 2, 3, 1),          ``LayerNorm2d``
                                    ``F.layer_norm``, permute back
``RmsNorm``     ``nn.Module``       ``F.rms_norm(x, normalized_shape, w, eps)``        ``RMSNorm``
==============  ==================  =================================================  ===================

eps defaults to 1e-6 in all three and is read from the module. An instance whose
``_fast_norm`` flag is set (``timm.layers.set_fast_norm()``: under autocast it computes
in the autocast dtype, or with apex) is left alone, as is a ``LayerNorm2d`` with a
weight and no bias (``normlab.nn.LayerNorm2d`` has both or neither). The twin holds the
very same ``Parameter`` objects under the same names (``state_dict`` keys unchanged);
the original module rides along on it (a plain attribute, no ``state_dict`` entry), and
``revert`` gives it back with the twin's current parameters and ``eps``. The outputs
agree in value; one layout difference: timm's ``LayerNorm2d`` returns its permuted
result (channels_last strides for an NCHW input), normlab's a contiguous tensor.
"""

from __future__ import annotations

import numbers

from torch import nn

from .conversion import adopt
from ..nn.layer_norm import LayerNorm, LayerNorm2d, RMSNorm
from ..nn import norm_act as na
from ..nn._activations import act_of

MODULE = "timm.layers.norm"
# class name -> the base class timm derives it from
CLASSES = {"LayerNorm": nn.LayerNorm, "LayerNorm2d": nn.LayerNorm, "RmsNorm": nn.Module}
_ORIGINAL = "_normlab_original"  # the converted module, kept on its twin for revert


def kind_of(cls: type) -> str | None:
    """``"LayerNorm"``, ``"LayerNorm2d"``, ``"RmsNorm"`` for those timm classes, else None."""
    if not isinstance(cls, type) or cls.__module__ != MODULE:
        return None
    base = CLASSES.get(cls.__qualname__)
    if base is None or cls.__bases__ != (base,):
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
    old.eps = twin.eps
    return old


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
