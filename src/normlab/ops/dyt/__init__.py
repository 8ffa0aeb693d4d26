"""DyT (Dynamic Tanh): the norm-free replacement of LayerNorm, ``y = tanh(alpha * x) * weight + bias``.

``reference.py``: the math in torch ops, the hand-derived backward and forward-mode rule, the
autograd Function, and the ``REF`` path (``ref_dyt``). The entry that runs each path is the public
function, ``normlab.functional.dyt`` (the C++ op ``torch.ops.normlab.dyt_fwd``: ``csrc/dyt.h``;
kernels ``csrc/cpu/dyt_kernels.cpp``).
"""

from .reference import DyTFunction, dyt_backward_ref, dyt_jvp, dyt_ref, ref_dyt

__all__ = ["dyt_ref", "dyt_backward_ref", "dyt_jvp", "DyTFunction", "ref_dyt"]
