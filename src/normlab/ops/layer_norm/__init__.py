"""LayerNorm and RMSNorm (and their fused residual-add variants).

- ``reference.py``: the math in plain torch ops, the hand-derived backward,
  the autograd Functions, and the entry points of backend ``"ref"``
  (:func:`ref_layer_norm`, ...).
- ``kernels.py``: the Numba kernels (backend ``"cpu"``), imported on first use;
  ``launch.py`` hands them tensors.
- ``op.py``: what is the kernels' own -- custom ops, eager and transform
  forms, declared to ``ops/_register`` -- and the entry points of backend
  ``"cpu"``.

Importing this package enters ``layer_norm``, ``rms_norm``, ``add_layer_norm``,
``add_rms_norm`` and ``layer_norm2d`` (``op_2d.py``: LayerNorm2d on the C++ extension,
both layouts) in the backend table (``"cpu"`` for the row norms when numba is installed,
checked without importing numba; for ``layer_norm2d`` when the extension is built).
"""

from .. import _register, extension
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
_register.implement("layer_norm2d", ref=ref_layer_norm2d, cpu=op_2d.layer_norm2d, available=extension.available)
