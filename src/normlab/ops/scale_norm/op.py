"""Scale-only norms: the family's entry, running the path ``normlab._backend.route`` decided.

- ``REF``: the reference, ``reference.ref_scale_norm`` (its autograd Function with the
  hand-derived backward);
- ``EAGER`` (RmsNorm2d, SimpleNorm2d): the C++ entry ``normlab._C.scale_norm2d_fast`` (the
  ``scale_norm2d_fwd`` op with its autograd node, without the dispatcher's Python layer); arguments
  it does not take (a tensor subclass) go through ``torch.ops.normlab.scale_norm2d_fwd``;
- ``COMPILE`` (the same two): ``torch.ops.normlab.scale_norm2d_fwd`` (its Meta kernel gives the shapes);
- SimpleNorm over trailing dims has no kernel: the reference on every path;
- ``TRANSFORM`` (torch.func transforms, forward-mode AD; on any path): the reference forward in
  plain torch ops, which torch differentiates and batches itself.
"""

from __future__ import annotations

import torch

from ..._backend import COMPILE, EAGER, TRANSFORM
from .. import _transforms, extension
from .reference import ref_scale_norm

_C = extension.load()


def scale_norm(path, x, normalized_shape, w, eps, kind, channels=False):
    """The norm of ``x`` on ``path`` (arguments judged by ``normlab.functional``); see
    :func:`reference.ref_scale_norm`."""
    if path == TRANSFORM or _transforms.active():
        return ref_scale_norm(x, normalized_shape, w, eps, kind, channels, plain=True)
    if channels and path == EAGER:
        y = _C.scale_norm2d_fast(x, w, eps, kind == "simple")
        if y is not None:
            return y
        return torch.ops.normlab.scale_norm2d_fwd(x, w, kind == "simple", eps)[0]
    if channels and path == COMPILE:
        return torch.ops.normlab.scale_norm2d_fwd(x, w, kind == "simple", eps)[0]
    return ref_scale_norm(x, normalized_shape, w, eps, kind, channels)
