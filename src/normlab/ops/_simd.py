"""Code-generation hints shared by the Numba kernels (imported by ``kernels.py`` files only).

- :func:`wide`: let LLVM vectorise the calling function with 512-bit registers.
- :func:`inline`: have LLVM inline the calling helper into every kernel that calls it.
- :data:`prefetch` / :data:`prefetch_write`: ask for the cache line of ``a[i, j]`` ahead of
  its loads / its stores.

All emit no arithmetic, so they never change a result, only its speed.
"""

from __future__ import annotations

from llvmlite import ir
from llvmlite.binding import llvm_version_info
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def _adds_attribute(attribute: str):
    """The code generator of an intrinsic that emits no code and adds the LLVM function
    ``attribute`` to the function being compiled. (llvmlite's attribute set only admits
    known names, hence ``set.add``; if that ever fails the attribute is skipped, never the
    kernel.)"""

    def codegen(context, builder, signature, args):
        try:
            set.add(builder.function.attributes, attribute)
        except Exception:  # pragma: no cover - an llvmlite without set-based attributes
            pass
        return context.get_dummy_value()

    return codegen


@intrinsic
def wide(typingctx):
    """Let LLVM vectorize the calling function with 512-bit registers where the CPU has them.

    Emits no code: adds the LLVM function attribute ``"prefer-vector-width"="512"``
    to the function being compiled (a helper, or a kernel's ``prange`` body).
    LLVM defaults to 256-bit vectors on AVX-512 CPUs; the kernels run ~5-10 %
    (float32) to ~25 % (bfloat16) faster with 512 (measured). On a CPU without
    AVX-512 the attribute changes nothing.
    """

    return types.none(), _adds_attribute('"prefer-vector-width"="512"')


@intrinsic
def inline(typingctx):
    """Have LLVM inline the calling helper wherever a kernel calls it.

    Emits no code: adds the LLVM attribute ``alwaysinline`` to the function being
    compiled. Numba compiles each helper as a function of its own and leaves the
    inlining to LLVM's cost model, which kept a row helper with two vector loops
    (``_sqdev_row``) as a call: per row, the arrays' fields pushed on the stack, a
    ``vzeroupper``, a status check. On rows of 16-64 float32 values that was 15-25 %
    of the LayerNorm forward (measured). The helper's instructions keep their own
    fast-math flags when inlined (LLVM keeps them per instruction), so its results
    are the same bits.
    """

    return types.none(), _adds_attribute("alwaysinline")


# llvm.prefetch is overloaded on its pointer type: "p0" with opaque pointers (LLVM >= 15), "p0i8" before
_PREFETCH = "llvm.prefetch.p0" if llvm_version_info[0] >= 15 else "llvm.prefetch.p0i8"


def _prefetch(write: int):
    """An intrinsic ``(a, i, j)`` asking for the cache line of the 2-D array element ``a[i, j]``
    (LLVM ``llvm.prefetch``, keep in all levels): for a read, or for a write (``write=1``: the
    line is fetched for ownership, ``prefetchw`` on x86, as a store would)."""

    @intrinsic
    def pf(typingctx, a, i, j):
        if not (isinstance(a, types.Array) and a.ndim == 2):
            return None

        def codegen(context, builder, signature, args):
            aty = signature.args[0]
            arr = context.make_array(aty)(context, builder, args[0])
            ptr = cgutils.get_item_pointer(context, builder, aty, arr, [args[1], args[2]], wraparound=False)
            i8p = ir.PointerType(ir.IntType(8))
            i32 = ir.IntType(32)
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), _PREFETCH
            )
            builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, write), ir.Constant(i32, 3),
                              ir.Constant(i32, 1)])
            return context.get_dummy_value()

        return types.none(a, i, j), codegen

    return pf


#: ``prefetch(a, i, j)``: ask for the cache line of ``a[i, j]`` ahead of its loads; no load
prefetch = _prefetch(0)
#: ``prefetch_write(a, i, j)``: ask for the line of ``a[i, j]`` ahead of its stores (for ownership)
prefetch_write = _prefetch(1)
