"""LayerNorm2d on the ``"cpu"`` backend: the entry point on the C++ op ``torch.ops.normlab.layer_norm2d``.

The op (registered in ``csrc/layer_norm.cpp``, with the layer_norm family; its autograd, with a
differentiable backward under ``create_graph=True``, is C++ too) reads a contiguous (NCHW) or
channels-last input without a copy and writes the output in the input's layout.

:func:`layer_norm2d` picks the form that runs a call: under torch.func transforms and
forward-mode AD (which refuse a C++ autograd function) LayerNorm's row path on
``x.movedim(1, -1)``, whose transform rules exist; while ``torch.compile`` traces,
``torch.ops.normlab.layer_norm2d``; otherwise the direct binding ``normlab._C.layer_norm2d``
(the same registered op without the Python-level dispatch of ``torch.ops``).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import _transforms, extension
from . import op as _row_op
from ..layouts import channels_as_rows

_is_compiling = torch.compiler.is_compiling
_transform_active = _transforms.active
_C = extension.load()


def layer_norm2d(x: Tensor, w: Optional[Tensor], b: Optional[Tensor], eps: float) -> Tensor:
    """The backend table's ``"cpu"`` LayerNorm2d over dim 1 of ``(N, C, *)`` ``x`` (arguments
    checked by ``normlab.functional.layer_norm2d``)."""
    if _transform_active():
        return channels_as_rows(_row_op.layer_norm, x, w, b, eps)
    if _is_compiling():
        return torch.ops.normlab.layer_norm2d(x, w, b, eps)
    return _C.layer_norm2d(x, w, b, eps)
