"""FRN: the family's entry, running the path ``normlab._backend.route`` decided.

- ``REF``: the reference, ``reference.ref_frn`` (its autograd Function with the hand-derived
  backward);
- ``EAGER``: the C++ entry ``normlab._C.frn_fast`` (the ``frn_fwd`` op with its autograd node,
  without the dispatcher's Python layer); arguments it does not take (a tensor subclass) go through
  ``torch.ops.normlab.frn_fwd``;
- ``COMPILE``: ``torch.ops.normlab.frn_fwd`` (traced as one node; its Meta kernel gives the shapes);
- ``TRANSFORM`` (torch.func transforms, forward-mode AD; on any path): the reference forward in
  plain torch ops, which torch differentiates and batches itself.
"""

from __future__ import annotations

import torch

from ..._backend import COMPILE, EAGER, TRANSFORM
from .. import _transforms, extension
from .reference import ref_frn

_C = extension.load()


def frn(path, x, w, b, tau, eps):
    """FRN (with the TLU when ``tau`` is given) of an (N, C, H, W) ``x`` on ``path``."""
    if path == TRANSFORM or _transforms.active():
        return ref_frn(x, w, b, tau, eps, plain=True)
    if path == EAGER:
        y = _C.frn_fast(x, w, b, tau, eps)
        if y is not None:
            return y
        return torch.ops.normlab.frn_fwd(x, w, b, tau, eps)[0]
    if path == COMPILE:
        return torch.ops.normlab.frn_fwd(x, w, b, tau, eps)[0]
    return ref_frn(x, w, b, tau, eps)
