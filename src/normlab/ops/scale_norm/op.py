"""Scale-only norms: the family's entry, running the path ``normlab._backend.route`` decided.

- ``REF``, ``EAGER``, ``COMPILE``: the reference, ``reference.ref_scale_norm`` (its autograd Function
  with the hand-derived backward);
- ``TRANSFORM`` (torch.func transforms, forward-mode AD; on any path): the reference forward in plain torch ops,
  which torch differentiates and batches itself.
"""

from __future__ import annotations

from ..._backend import TRANSFORM
from .. import _transforms
from .reference import ref_scale_norm


def scale_norm(path, x, normalized_shape, w, eps, kind, channels=False):
    """The norm of ``x`` on ``path`` (arguments judged by ``normlab.functional``); see
    :func:`reference.ref_scale_norm`."""
    return ref_scale_norm(x, normalized_shape, w, eps, kind, channels, plain=path == TRANSFORM or _transforms.active())
