"""Arrays over raw data pointers, for the kernels' entry functions (imported by ``kernels.py`` files only).

The launchers hand tensors to the kernels as ``t.data_ptr()`` integers rather
than as numpy arrays: ``Tensor.numpy()`` costs about 2 us a tensor, which is
most of a call on a small tensor, where ``data_ptr()`` costs 0.2 us. An entry
function (``*_at`` in a family's ``kernels.py``) rebuilds the arrays with
:func:`at` -- no copy, C-contiguous, the element type taken from a one-element
prototype array of the storage dtype (``int16`` for bfloat16 bits, ``uint16``
for float16: ``ops/_bf16.py``) -- and calls the kernel on them.

The caller owns the memory: every pointer must point at a live, C-contiguous
buffer of at least the given shape (the launchers keep the tensors referenced
for the duration of the call).
"""

from __future__ import annotations

import numpy as np
from numba import carray, types
from numba.extending import intrinsic

from ._jit import helper


@intrinsic
def _pointer(typingctx, addr, proto):
    """``addr`` (an integer) as a pointer to ``proto``'s element type (LLVM inttoptr)."""
    if not (isinstance(addr, types.Integer) and isinstance(proto, types.Array)):
        return None
    sig = types.CPointer(proto.dtype)(addr, proto)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

    return sig, codegen


@helper
def at(addr, proto, shape):
    """The C-contiguous array of ``shape`` (a tuple) at address ``addr``, with ``proto``'s dtype."""
    return carray(_pointer(addr, proto), shape)


@helper
def params_at(acc, pw, pb, n):
    """Weight and bias (n,) in the accumulation dtype (``acc``'s) at ``pw``/``pb``; ones / zeros
    for address 0 (an absent weight or bias)."""
    w = at(pw, acc, (n,)) if pw != 0 else np.ones(n, acc.dtype)
    b = at(pb, acc, (n,)) if pb != 0 else np.zeros(n, acc.dtype)
    return w, b
