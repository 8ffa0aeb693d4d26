"""Scale-only norms (timm's RmsNorm2d, SimpleNorm, SimpleNorm2d): ``y = x * rsqrt(s + eps) * weight``
with ``s`` the mean square (``rms``) or the unbiased variance (``simple``) of each row, and no shift.

- ``reference.py``: the math in torch ops, the hand-derived backward, the autograd Function and
  the ``REF`` path (``ref_scale_norm``).

The entries that run each path of the gate are the public functions (``functional/scale_norms.py``).
"""

from .reference import ScaleNormFunction, ref_scale_norm, scale_norm_backward_ref, scale_norm_ref

__all__ = ["scale_norm_ref", "scale_norm_backward_ref", "ScaleNormFunction", "ref_scale_norm"]
