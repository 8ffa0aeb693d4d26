"""Local response normalization (LRN): each value divided by a power of the sum of squares over a
window of neighbouring channels, ``y = x / (k + alpha / size * sum_window x^2) ** beta``.

- ``reference.py``: the math in torch ops (a sum of squares over a channel window), the
  hand-derived backward and forward-mode rule, the autograd Function, and the ``REF`` path
  (``ref_local_response_norm``). Two windows: torch.nn.LocalResponseNorm's (``"lrn"``) and
  torch.nn.CrossMapLRN2d's (``"cross_map"``).

The entry that runs each path of the gate is the public function,
``normlab.functional.local_response_norm`` (and ``cross_map_lrn2d``).

No C++ kernel: LRN is a rare layer (AlexNet, GoogLeNet), and torch's own is composed of pooling
ops; every path of the gate runs the reference, which is already a few passes of torch ops.
"""

from .reference import (
    LocalResponseNormFunction,
    local_response_norm_backward_ref,
    local_response_norm_jvp,
    local_response_norm_ref,
    ref_local_response_norm,
    window,
)

__all__ = [
    "window",
    "local_response_norm_ref",
    "local_response_norm_backward_ref",
    "local_response_norm_jvp",
    "LocalResponseNormFunction",
    "ref_local_response_norm",
]
