"""bfloat16 / float16 <-> float32 by bits, for numba kernels.

Numba has no bfloat16 (and no float16 arithmetic on the CPU), so kernels get
half-precision tensors as their raw bits, without a copy::

    bfloat16 tensor -> t.view(torch.int16).numpy()    (int16 array: bfloat16 bits)
    float16 tensor  -> t.view(torch.uint16).numpy()   (uint16 array: float16 bits)

and convert one element at a time while they stream through a row, so no
full-size float32 copy of the input is ever made. The element type tells the
two half formats apart; :func:`load` and :func:`store` dispatch on it (at
compile time), so one kernel source serves float32, float64, bfloat16 and
float16 arrays; :func:`round_as` rounds a number to an array's format without
storing it; :func:`acc_zero` and :func:`acc_cast` give numbers in the
accumulation dtype (float64 for float64 arrays, float32 otherwise).

Conversions to half precision round to nearest, ties to even (as torch's
``.to(torch.bfloat16)``); overflow gives +-inf; NaN stays NaN (sign and the
top payload bits kept, quiet bit set). Conversions to float32 are exact.
float16 uses the CPU's conversion instructions where it has them (x86 F16C,
via LLVM ``fpext``/``fptrunc``: :data:`HW_F16`), the integer versions
:func:`f16_to_f32` / :func:`f32_to_f16` otherwise; both give torch's bits.
All the integer code is written with selects rather than branches so that
loops over a row vectorize.

This module imports numba: import it only from ``kernels.py`` modules.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from ._jit import helper

# --------------------------------------------------------------------------
# Reinterpreting 32 bits (no conversion): LLVM bitcast
# --------------------------------------------------------------------------


@intrinsic
def _f32_from_bits(typingctx, u):
    """float32 whose bits are the low 32 bits of the integer ``u``.

    (Numba widens integer arithmetic to 64 bits; the bits above 32 are dropped.)
    """
    if not isinstance(u, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        bits = args[0]
        if u.bitwidth > 32:
            bits = builder.trunc(bits, ir.IntType(32))
        elif u.bitwidth < 32:
            bits = builder.zext(bits, ir.IntType(32))
        return builder.bitcast(bits, ir.FloatType())

    return types.float32(u), codegen


@intrinsic
def _f32_to_bits(typingctx, f):
    """The bits of the float32 ``f`` as a uint32."""
    if f != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


@intrinsic
def _f16_hw_to_f32(typingctx, h):
    """float16 bits (uint16) -> float32 by LLVM ``fpext half``: one vcvtph2ps with F16C."""
    if h != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


@intrinsic
def _f32_hw_to_f16(typingctx, f):
    """float32 -> float16 bits (uint16) by LLVM ``fptrunc``: one vcvtps2ph (round to nearest even)."""
    if f != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(types.float32), codegen


def _host_has_f16c() -> bool:
    """x86 F16C: LLVM lowers half conversions to single instructions (else to libcalls
    that numba's JIT may not link, so the integer versions below are used)."""
    try:
        import llvmlite.binding as llvm

        return bool(llvm.get_host_cpu_features().get("f16c", False))
    except Exception:  # pragma: no cover - unusual llvmlite builds
        return False


HW_F16 = _host_has_f16c()

_U16 = np.uint32(16)
_U13 = np.uint32(13)
_ONE = np.uint32(1)

# --------------------------------------------------------------------------
# bfloat16: the top 16 bits of a float32
# --------------------------------------------------------------------------


@helper
def bf16_to_f32(bits):
    """bfloat16 bits (int16) -> float32, exact."""
    u = np.uint32(np.uint16(bits)) << _U16
    return _f32_from_bits(u)


@intrinsic
def f32_to_bf16(typingctx, v):
    """float32 -> bfloat16 bits (int16), round to nearest even; NaN stays NaN.

    In 32-bit LLVM integer ops (numba would widen them to 64 bits), without
    branches, so a loop of it vectorizes::

        r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16    ties go to the even upper half;
                                                    +-max rounds up to +-inf
        NaN: (u >> 16) | 0x0040                     sign and payload kept, quiet bit set
    """
    if v != types.float32:
        return None

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        f = args[0]
        u = builder.bitcast(f, i32)
        hi = builder.lshr(u, ir.Constant(i32, 16))
        lsb = builder.and_(hi, ir.Constant(i32, 1))
        r = builder.lshr(builder.add(builder.add(u, ir.Constant(i32, 0x7FFF)), lsb), ir.Constant(i32, 16))
        nan = builder.or_(hi, ir.Constant(i32, 0x0040))
        is_nan = builder.fcmp_unordered("uno", f, f)
        return builder.trunc(builder.select(is_nan, nan, r), ir.IntType(16))

    return types.int16(types.float32), codegen


# --------------------------------------------------------------------------
# float16 (IEEE binary16): 1 sign, 5 exponent (bias 15), 10 mantissa bits
# --------------------------------------------------------------------------


@helper
def f16_to_f32(bits):
    """float16 bits (uint16) -> float32, exact (subnormals, inf, NaN included).

    Branch-free (LLVM turns the ``if``s into selects, so loops of it vectorize):
    move exponent and mantissa into float32 position and rebias the exponent
    by 127 - 15 = 112; an all-ones exponent (inf/NaN) is rebiased once more to
    255; a zero exponent (zero/subnormal) is renormalised by one float32
    subtraction of normal numbers: (1 + m/1024) * 2^-14 - 2^-14 = m * 2^-24.
    """
    h = np.uint32(bits)
    sign = (h & np.uint32(0x8000)) << _U16
    o = (h & np.uint32(0x7FFF)) << _U13  # exponent and mantissa, float32 position
    e = o & np.uint32(0x0F800000)  # the float16 exponent field
    o = o + np.uint32(0x38000000)  # exponent + 112
    r = _f32_from_bits(o)
    if e == np.uint32(0x0F800000):  # inf / NaN: exponent 31 + 112 + 112 = 255, payload kept
        r = _f32_from_bits(o + np.uint32(0x38000000))
    if e == np.uint32(0):  # zero / subnormal
        r = _f32_from_bits(o + np.uint32(0x00800000)) - np.float32(6.103515625e-05)
    return _f32_from_bits(_f32_to_bits(r) | sign)


@helper
def f32_to_f16(v):
    """float32 -> float16 bits (uint16), round to nearest even; overflow -> inf; NaN stays NaN.

    Branch-free (selects), so loops of it vectorize:

    - |v| >= 2^-14 (normal): rebias the exponent 127 -> 15 and round away 13
      mantissa bits, ties to even; a carry rounds into the exponent, and
      |v| >= 65520 carries into exponent 31, mantissa 0: inf.
    - |v| < 2^-14 (subnormal/zero): the float32 adder rounds: |v| + 0.5 puts
      the float16 subnormal's bits at the bottom of the mantissa of 0.5.
    - |v| >= 65536 (incl. inf): inf; NaN: quiet NaN with the top payload bits.
    """
    u = _f32_to_bits(np.float32(v))
    sign = (u >> _U16) & np.uint32(0x8000)
    a = u & np.uint32(0x7FFFFFFF)  # |v|
    # normal
    o = (a - np.uint32(0x38000000) + np.uint32(0xFFF) + ((a >> _U13) & _ONE)) >> _U13
    if a < np.uint32(0x38800000):  # subnormal or zero
        o = _f32_to_bits(_f32_from_bits(a) + np.float32(0.5)) - np.uint32(0x3F000000)
    if a >= np.uint32(0x47800000):  # |v| >= 65536, inf
        o = np.uint32(0x7C00)
    if a > np.uint32(0x7F800000):  # NaN: quiet, top payload bits kept
        o = np.uint32(0x7E00) | ((a >> _U13) & np.uint32(0x3FF))
    return np.uint16(sign | o)


# --------------------------------------------------------------------------
# Element access by storage type (resolved when numba compiles a kernel)
# --------------------------------------------------------------------------


def load(a, k):
    """``a[k]`` as a number in the accumulation dtype (float32, or float64 for float64 arrays)."""
    raise NotImplementedError("load is only callable from numba code")


def store(a, k, v):
    """``a[k] = v``, rounded to ``a``'s format (bfloat16/float16 bits, float32, float64)."""
    raise NotImplementedError("store is only callable from numba code")


def round_as(a, v):
    """``v`` rounded to ``a``'s storage format and back: a number in the accumulation dtype
    equal to what ``store`` then ``load`` would give, without touching memory (exact for
    float32 and float64 arrays, whose accumulation dtype is their own)."""
    raise NotImplementedError("round_as is only callable from numba code")


def acc_zero(a):
    """Zero in the accumulation dtype of ``a``'s elements."""
    raise NotImplementedError("acc_zero is only callable from numba code")


def zero_of(v):
    """Zero in the float type of the number ``v`` (``v - v`` is NaN for an infinite or NaN ``v``)."""
    raise NotImplementedError("zero_of is only callable from numba code")


def acc_cast(a, v):
    """``v`` rounded to the accumulation dtype of ``a``'s elements.

    Numba computes ``float32 / int`` and ``float32 + python float`` in float64;
    this brings such results back to float32 where the accumulation dtype is
    float32 (as torch would compute them).
    """
    raise NotImplementedError("acc_cast is only callable from numba code")


@overload(load)
def _load(a, k):
    dt = a.dtype
    if dt == types.int16:
        return lambda a, k: bf16_to_f32(a[k])
    if dt == types.uint16:
        if HW_F16:
            return lambda a, k: _f16_hw_to_f32(a[k])
        return lambda a, k: f16_to_f32(a[k])
    if dt == types.float32:
        return lambda a, k: a[k]
    if dt == types.float64:
        return lambda a, k: a[k]
    return None


@overload(store)
def _store(a, k, v):
    dt = a.dtype
    if dt == types.int16:

        def impl(a, k, v):
            a[k] = f32_to_bf16(np.float32(v))

        return impl
    if dt == types.uint16:
        if HW_F16:

            def impl(a, k, v):
                a[k] = _f32_hw_to_f16(np.float32(v))

        else:

            def impl(a, k, v):
                a[k] = f32_to_f16(v)

        return impl
    if dt == types.float32:

        def impl(a, k, v):
            a[k] = np.float32(v)

        return impl
    if dt == types.float64:

        def impl(a, k, v):
            a[k] = np.float64(v)

        return impl
    return None


@overload(round_as)
def _round_as(a, v):
    dt = a.dtype
    if dt == types.int16:
        return lambda a, v: bf16_to_f32(f32_to_bf16(np.float32(v)))
    if dt == types.uint16:
        if HW_F16:
            return lambda a, v: _f16_hw_to_f32(_f32_hw_to_f16(np.float32(v)))
        return lambda a, v: f16_to_f32(f32_to_f16(v))
    if dt == types.float32:
        return lambda a, v: np.float32(v)
    if dt == types.float64:
        return lambda a, v: np.float64(v)
    return None


@overload(acc_zero)
def _acc_zero(a):
    if a.dtype == types.float64:
        return lambda a: np.float64(0.0)
    if a.dtype in (types.int16, types.uint16, types.float32):
        return lambda a: np.float32(0.0)
    return None


@overload(zero_of)
def _zero_of(v):
    if v == types.float64:
        return lambda v: np.float64(0.0)
    if v == types.float32:
        return lambda v: np.float32(0.0)
    return None


@overload(acc_cast)
def _acc_cast(a, v):
    if a.dtype == types.float64:
        return lambda a, v: np.float64(v)
    if a.dtype in (types.int16, types.uint16, types.float32):
        return lambda a, v: np.float32(v)
    return None
