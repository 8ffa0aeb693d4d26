"""LayerNorm, RMSNorm, their fused residual-add variants, and LayerNorm2d.

- ``reference.py``: the math in plain torch ops, the hand-derived backward,
  the autograd Functions, and the ``REF`` path (:func:`ref_layer_norm`, ...).

The entries that run each path of the gate (the reference, or the C++ ops
``torch.ops.normlab.layer_norm_fwd``, ..., ``layer_norm2d`` eager, compiled or under a transform)
are the public functions, ``normlab.functional.layer_norm`` and its siblings
(``functional/row_norms.py``).
"""

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
