"""DyT: the family's entry, running the path ``normlab._backend.route`` decided.

The paths:

- ``REF``: the reference math, ``reference.ref_dyt``;
- ``EAGER``: the C++ entry ``normlab._C.dyt_fast`` (the ``dyt_fwd`` op with its autograd node,
  without the dispatcher's Python layer); arguments it does not take (a tensor subclass) go
  through ``torch.ops.normlab.dyt_fwd``;
- ``COMPILE``: ``torch.ops.normlab.dyt_fwd`` (traced as one node; its Meta kernel gives the shape);
- ``TRANSFORM`` (torch.func transforms, forward-mode AD): the reference Function, whose torch ops
  carry its own vmap rule and its hand-derived jvp (``reference.DyTFunction``) -- DyT is
  elementwise, so the reference is already one pass of torch ops.
"""

from __future__ import annotations

import torch

from ..._backend import COMPILE, EAGER, REF, TRANSFORM
from .. import extension
from .reference import ref_dyt

_C = extension.load()


def dyt(path, x, normalized_shape, alpha, w, b):
    """DyT over the trailing ``normalized_shape`` dims of ``x`` on ``path`` (arguments judged by
    ``normlab.functional.dyt``; ``alpha`` of shape (1,))."""
    if path == REF or path == TRANSFORM:
        return ref_dyt(x, normalized_shape, alpha, w, b)
    if path == EAGER:
        y = _C.dyt_fast(x, normalized_shape, alpha, w, b)
        if y is not None:
            return y
    return torch.ops.normlab.dyt_fwd(x, w, b, normalized_shape, alpha)
