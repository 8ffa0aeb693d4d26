"""Filter Response Normalization (Singh and Krishnan, 2020; timm's FilterResponseNormTlu2d and
FilterResponseNormAct2d): ``z = x * rsqrt(mean_HW(x^2) + eps) * weight + bias``, then the TLU
``max(z, tau)`` (or, in the modules, an activation).

- ``reference.py``: the math in torch ops, the hand-derived backward, the autograd Function and
  the ``REF`` path (``ref_frn``).

The entry that runs each path of the gate is the public function,
``normlab.functional.filter_response_norm``.
"""

from .reference import FRNFunction, frn_backward_ref, frn_ref, ref_frn

__all__ = ["frn_ref", "frn_backward_ref", "FRNFunction", "ref_frn"]
