"""LayerNorm, RMSNorm, their fused residual-add variants, and LayerNorm2d.

- ``reference.py``: the math in plain torch ops, the hand-derived backward,
  the autograd Functions, and the ``REF`` path (:func:`ref_layer_norm`, ...).
- ``op.py``: the entries of the row norms, one function per op taking the path
  ``normlab._backend.route`` decided: the reference, or the C++ ops
  (``torch.ops.normlab.layer_norm_fwd``, ...) eager, compiled or under a transform
  (their transform Function: vmap and forward-mode rules).
- ``op_2d.py``: LayerNorm2d's entry, on the C++ op ``torch.ops.normlab.layer_norm2d``
  (both layouts).
"""

from . import op, op_2d  # noqa: F401 (the entries: layer_norm.op, layer_norm.op_2d)
from .reference import (
    LayerNormFunction,
    RMSNormFunction,
    layer_norm_backward_ref,
    layer_norm_ref,
    layer_norm_stats,
    ref_add_layer_norm,
    ref_add_rms_norm,
    ref_layer_norm,
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
