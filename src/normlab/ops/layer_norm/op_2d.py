"""LayerNorm2d: the family's entry, running the path ``normlab._backend.route`` decided.

The C++ op ``torch.ops.normlab.layer_norm2d`` (registered in ``csrc/layer_norm.cpp``, with the layer_norm family; its
autograd, with a differentiable backward under ``create_graph=True``, is C++ too) reads a
contiguous (NCHW) or channels-last input without a copy and writes the output in the input's
layout. The paths: ``REF``, ``reference.ref_layer_norm2d``; ``TRANSFORM`` (torch.func transforms
and forward-mode AD, which refuse a C++ autograd function), LayerNorm's row path on
``x.movedim(1, -1)``, whose transform rules exist; ``COMPILE``, ``torch.ops.normlab.layer_norm2d``;
``EAGER``, the direct binding ``normlab._C.layer_norm2d`` (the same registered op without the
Python-level dispatch of ``torch.ops``).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..._backend import COMPILE, REF, TRANSFORM
from .. import extension
from . import op as _row_op
from ..layouts import channels_as_rows
from .reference import ref_layer_norm2d

_C = extension.load()


def layer_norm2d(path: int, x: Tensor, w: Optional[Tensor], b: Optional[Tensor], eps: float) -> Tensor:
    """LayerNorm2d over dim 1 of ``(N, C, *)`` ``x`` on ``path`` (arguments judged by
    ``normlab.functional.layer_norm2d``)."""
    if path == REF:
        return ref_layer_norm2d(x, w, b, eps)
    if path == TRANSFORM:
        return channels_as_rows(lambda *a: _row_op.layer_norm(TRANSFORM, *a), x, w, b, eps)
    if path == COMPILE:
        return torch.ops.normlab.layer_norm2d(x, w, b, eps)
    return _C.layer_norm2d(x, w, b, eps)
