"""The kernels' side of the Numba boundary: compile options, the decorators, the serial twins.

Imported by the kernel modules (each family's ``kernels*.py``, ``ops/_bf16.py``,
``_rows.py``, ``_ptr.py``), and by the launchers for :func:`serial`; imports
neither numba (until :func:`numba` is first called) nor torch.

Two decorators, one spelling each:

- :func:`kernel`: a kernel, ``numba.njit(**KERNEL_OPTIONS)`` (``parallel=True``);
- :func:`helper`: a function that kernels call (inlined by LLVM), without
  ``parallel``; ``@helper(sums=True)`` for one whose only job is a sum that LLVM
  may split into SIMD lanes (:data:`SUM_OPTIONS`), ``@helper(sums=True, fma=True)``
  when its products may also be fused into those sums.

Every kernel has a serial twin (:func:`serial`: the same source without
``parallel``), which small tensors, one-thread runs and forked processes take
(``ops/_launch.use_parallel``). Both give the same bits.

``cache=True`` writes the machine code next to the source
(``__pycache__/*.nbi, *.nbc``), so a second process loads it instead of
compiling it (cold: ~15-25 s for the LayerNorm kernels' four dtypes; warm: well
under a second). Caveat of numba's cache: it is keyed on the kernel's own source
file. Editing a helper in another module (``_bf16.py``, ``_rows.py``,
``_ptr.py``) does not invalidate kernels cached from ``kernels.py``; delete the
``.nbi``/``.nbc`` files after such an edit. (An installed release changes every
file, so users are not affected.)
"""

from __future__ import annotations

import types

# parallel: prange loops run on numba's thread pool.
# cache: machine code kept on disk, keyed on the source file.
# fastmath=False: no reassociation (the shifted two-pass statistics rely on the
#   order of operations) and NaN/Inf propagate exactly as in torch.
# error_model="numpy": x / 0 gives inf/nan like torch, no ZeroDivisionError check
#   in every loop.
KERNEL_OPTIONS = dict(parallel=True, cache=True, fastmath=False, nogil=True, error_model="numpy")
# the same for small functions that kernels call (inlined by LLVM)
HELPER_OPTIONS = dict(cache=True, fastmath=False, nogil=True, error_model="numpy")
# helpers whose only job is a sum that LLVM may split into SIMD lanes: reassociation
# of those additions and nothing else (no NaN/Inf assumptions); the order is fixed
# by the compiled code, so the bits do not depend on the number of threads
SUM_OPTIONS = dict(HELPER_OPTIONS, fastmath={"reassoc"})

_numba = None

# The kernels compiled with ``parallel=True`` (``@kernel``), and the serial twin of
# every function that reaches one (see :func:`serial`).
_PARALLEL: set = set()
_TWINS: dict = {}


def numba():
    """The numba module, imported on first use (~0.2 s)."""
    global _numba
    if _numba is None:
        import numba as _nb

        _numba = _nb
    return _numba


def kernel(fn):
    """Decorator for a kernel: ``numba.njit(**KERNEL_OPTIONS)``.

    Every kernel also has a serial twin (:func:`serial`), compiled from the same
    source without ``parallel``, on first use.
    """
    disp = numba().njit(**KERNEL_OPTIONS)(fn)
    _PARALLEL.add(disp)
    return disp


def helper(fn=None, *, sums: bool = False, fma: bool = False, generic: bool = False, spliced: bool = False):
    """Decorator for a function that kernels call: ``numba.njit(**HELPER_OPTIONS)``;
    ``@helper(sums=True)``: :data:`SUM_OPTIONS` (its sums may be split into SIMD lanes);
    with ``fma=True`` also ``contract`` (a product and a sum may become one fused multiply-add);
    ``generic=True``: compiled once per argument *type*, not once per constant (:func:`_generic`);
    ``spliced=True``: a few lines that numba splices into each caller before typing
    (``inline="always"``), compiled as part of the caller (with the caller's options) and never
    on their own -- a compiled function of its own costs ~0.15 s of a cold first call for
    every argument type it meets (measured: numba's compile events)."""
    options = HELPER_OPTIONS
    if sums:
        options = dict(SUM_OPTIONS, fastmath={"reassoc", "contract"}) if fma else SUM_OPTIONS
    if spliced:
        if sums:
            raise ValueError("helper: spliced code takes its caller's options; sums=True needs a function of its own")
        options = dict(options, inline="always")

    def make(f):
        disp = numba().njit(**options)(f)
        return _generic(disp) if generic else disp

    return make if fn is None else make(fn)


def _generic(disp):
    """``disp``, typed at its call sites in kernels without their constants' literal values.

    Numba compiles a jitted function called from jitted code once for every distinct
    argument type, and a constant argument's type is its literal value (``Literal[int](0)``,
    ``Literal[bool](True)``): a helper called with row index 0 at one site and 1 at another,
    or passing such constants on to other helpers, is compiled once per combination. The
    GroupNorm block kernels' helpers were compiled 6-14 times each, ~20 s of a cold first
    call each way (measured); typed as plain ``int64``/``bool`` they compile once (~6-9 s).
    Only the typing changes: the helper's code and results are the same for every value.
    """
    get_call_template = disp.get_call_template
    unliteral = numba().types.unliteral

    def unliteral_call_template(args, kws):
        return get_call_template(tuple(unliteral(a) for a in args), {k: unliteral(v) for k, v in kws.items()})

    disp.get_call_template = unliteral_call_template
    return disp


def _reaches_kernel(disp, seen=None) -> bool:
    """Whether the jitted function ``disp`` is a parallel kernel or calls one (directly or not)."""
    if disp in _PARALLEL:
        return True
    seen = set() if seen is None else seen
    if disp in seen:
        return False
    seen.add(disp)
    fn = disp.py_func
    for name in fn.__code__.co_names:
        g = fn.__globals__.get(name)
        if _is_dispatcher(g) and _reaches_kernel(g, seen):
            return True
    return False


def _is_dispatcher(obj) -> bool:
    return _numba is not None and isinstance(obj, _numba.core.dispatcher.Dispatcher)


def serial(disp):
    """The serial twin of the jitted function ``disp``: the same source, compiled without
    ``parallel`` (``prange`` is ``range``), calling the serial twins of the kernels it calls.

    Results are the same bits as the parallel version's: the kernels' work split
    (chunks, tasks, the order partial sums are merged in) depends on the shape
    only, never on threads. The twin runs on the calling thread with no parallel
    region at all: it is what small tensors take (a parallel launch costs more than
    their work) and what a forked child takes. A function that reaches no kernel
    is its own twin. Twins get their own qualified name (``<name>__serial``), so
    numba caches them on disk apart from the parallel versions.
    """
    if not _is_dispatcher(disp):  # plain Python (a routing rule, a constant): no twin needed
        return disp
    twin = _TWINS.get(disp)
    if twin is not None:
        return twin
    if not _reaches_kernel(disp):
        _TWINS[disp] = disp
        return disp
    fn = disp.py_func
    scope = dict(fn.__globals__)
    for name in fn.__code__.co_names:
        g = scope.get(name)
        if _is_dispatcher(g):
            scope[name] = serial(g)
    clone = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    clone.__qualname__ = fn.__qualname__ + "__serial"
    clone.__module__ = fn.__module__
    clone.__doc__ = fn.__doc__
    options = {k: v for k, v in disp.targetoptions.items() if k not in ("parallel", "nopython")}
    cached = type(disp._cache).__name__ != "NullCache"  # `cache` is no target option: ask the dispatcher
    twin = _TWINS[disp] = numba().njit(cache=cached, **options)(clone)
    return twin
