"""DyT (Dynamic Tanh): the norm-free replacement of LayerNorm, ``y = tanh(alpha * x) * weight + bias``.

- ``reference.py``: the math in torch ops, the hand-derived backward and forward-mode rule,
  the autograd Function, and the ``REF`` path (``ref_dyt``).
- ``op.py``: the entry, taking the path ``normlab._backend.route`` decided: the reference, or
  the C++ op ``torch.ops.normlab.dyt_fwd`` (``csrc/dyt.cpp``; kernels ``csrc/cpu/dyt_kernels.cpp``)
  eager or compiled.
"""

from . import op  # noqa: F401 (the entry: dyt.op)
from .reference import DyTFunction, dyt_backward_ref, dyt_jvp, dyt_ref, ref_dyt

__all__ = ["dyt_ref", "dyt_backward_ref", "dyt_jvp", "DyTFunction", "ref_dyt"]
