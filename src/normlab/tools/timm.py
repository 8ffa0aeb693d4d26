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
        return None
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
