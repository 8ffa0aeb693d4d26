"""LayerNorm, RMSNorm, their fused residual-add variants, and LayerNorm2d.

- ``reference.py``: the math in plain torch ops, the hand-derived backward,
  the autograd Functions, and the entry points of backend ``"ref"``
  (:func:`ref_layer_norm`, ...).
- ``op.py``: the entry points of backend ``"cpu"`` for the row norms, on the C++ ops
  (``torch.ops.normlab.layer_norm_fwd``, ...), and their transform Function (vmap and
  forward-mode rules).
- ``op_2d.py``: the entry point of backend ``"cpu"`` for LayerNorm2d, on the C++ op
  ``torch.ops.normlab.layer_norm2d`` (both layouts).

Importing this package enters ``layer_norm``, ``rms_norm``, ``add_layer_norm``,
``add_rms_norm`` and ``layer_norm2d`` in the backend table (``"cpu"`` where the C++
extension is installed).
"""

from .. import _register
from . import op, op_2d
from .reference import (
    LayerNormFunction,
    RMSNormFunction,
    layer_norm_backward_ref,
    layer_norm_ref,
    layer_norm_stats,
    ref_add_layer_norm,
    ref_add_rms_norm,
    ref_layer_norm,
    ref_layer_norm2d,
    ref_rms_norm,
    rms_norm_backward_ref,
    rms_norm_ref,
    rms_norm_stats,
)

__all__ = [
    "layer_norm_ref",
    "rms_norm_ref",
    "layer_norm_backward_ref",
    "rms_norm_backward_ref",
    "layer_norm_stats",
    "rms_norm_stats",
    "LayerNormFunction",
    "RMSNormFunction",
    "ref_layer_norm",
    "ref_rms_norm",
    "ref_add_layer_norm",
    "ref_add_rms_norm",
]

_register.implement("layer_norm", ref=ref_layer_norm, cpu=op.layer_norm)
_register.implement("rms_norm", ref=ref_rms_norm, cpu=op.rms_norm)
_register.implement("add_layer_norm", ref=ref_add_layer_norm, cpu=op.add_layer_norm)
_register.implement("add_rms_norm", ref=ref_add_rms_norm, cpu=op.add_rms_norm)
_register.implement("layer_norm2d", ref=ref_layer_norm2d, cpu=op_2d.layer_norm2d)
