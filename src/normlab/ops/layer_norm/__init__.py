"""LayerNorm and RMSNorm (and their fused residual-add variants).

- ``reference.py``: the math in plain torch ops, the hand-derived backward,
  the autograd Functions, and the entry points of backend ``"ref"``
  (:func:`ref_layer_norm`, ...).
- ``op.py``: the entry points of backend ``"cpu"``: thin glue to the C++ ops
  (``csrc/layer_norm.cpp``, ``csrc/cpu/layer_norm_kernels.cpp``) and the transform Function
  (vmap and forward-mode rules) that calls them.

Importing this package enters ``layer_norm``, ``rms_norm``, ``add_layer_norm``,
``add_rms_norm`` and ``layer_norm2d`` (``launch_2d.py``: LayerNorm2d's NCHW kernels,
``kernels_2d.py``) in the backend table (``"cpu"`` where the C++ extension is installed;
``layer_norm2d`` still on its Numba kernels).
"""

from .. import _register, extension
from . import launch_2d, op
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

_register.implement("layer_norm", ref=ref_layer_norm, cpu=op.layer_norm, available=extension.available)
_register.implement("rms_norm", ref=ref_rms_norm, cpu=op.rms_norm, available=extension.available)
_register.implement("add_layer_norm", ref=ref_add_layer_norm, cpu=op.add_layer_norm, available=extension.available)
_register.implement("add_rms_norm", ref=ref_add_rms_norm, cpu=op.add_rms_norm, available=extension.available)
_register.implement("layer_norm2d", ref=ref_layer_norm2d, cpu=launch_2d.layer_norm2d)
