"""FRN: the family's entry, running the path ``normlab._backend.route`` decided.

- ``REF``, ``EAGER``, ``COMPILE``: the reference, ``reference.ref_frn`` (its autograd Function with
  the hand-derived backward);
- ``TRANSFORM`` (torch.func transforms, forward-mode AD; on any path): the reference forward in plain torch ops,
  which torch differentiates and batches itself.
"""

from __future__ import annotations

from ..._backend import TRANSFORM
from .. import _transforms
from .reference import ref_frn


def frn(path, x, w, b, tau, eps):
    """FRN (with the TLU when ``tau`` is given) of an (N, C, H, W) ``x`` on ``path``."""
    return ref_frn(x, w, b, tau, eps, plain=path == TRANSFORM or _transforms.active())
