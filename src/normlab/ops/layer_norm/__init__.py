"""LayerNorm and RMSNorm (and their fused residual-add variants).

- ``reference.py``: the math in plain torch ops, the hand-derived backward,
  the autograd Functions (backend ``"ref"``).
- ``kernels.py``: the Numba kernels (backend ``"cpu"``), imported on first use.
- ``op.py``: the kernels as ``torch.library`` custom ops (``normlab::layer_norm_fwd``,
  ...) with fake implementations and autograd, and the entry points
  :func:`layer_norm`, :func:`rms_norm`, :func:`add_layer_norm`,
  :func:`add_rms_norm` that ``normlab.functional`` calls.

Importing this package registers the ``"cpu"`` backend for these ops (when
numba is installed) without importing numba.
"""

from ... import _backend
from .. import _numba
from .op import add_layer_norm, add_rms_norm, layer_norm, rms_norm
from .reference import (
    LayerNormFunction,
    RMSNormFunction,
    layer_norm_backward_ref,
    layer_norm_ref,
    layer_norm_stats,
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
    "layer_norm",
    "rms_norm",
    "add_layer_norm",
    "add_rms_norm",
]

if _numba.available():
    _backend.register_backend(
        "cpu",
        _numba.serves_cpu,
        ops=("layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"),
    )
