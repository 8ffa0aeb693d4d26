"""Numba for the ``"cpu"`` backend: imported lazily, compiled once, cached on disk.

Importing ``normlab`` never imports numba: a family's ``kernels.py`` (the only
importer of numba, with ``ops/_bf16.py``) is loaded on the first call that runs
a kernel. Kernels are compiled with :data:`KERNEL_OPTIONS` -- ``cache=True``
writes the machine code next to the source (``__pycache__/*.nbi, *.nbc``), so a
second process loads it instead of compiling it (cold: ~15-25 s for the
LayerNorm kernels' four dtypes; warm: well under a second).

Caveat of numba's cache: it is keyed on the kernel's own source file. Editing
a helper in another module (``_bf16.py``) does not invalidate kernels cached
from ``kernels.py``; delete the ``.nbi``/``.nbc`` files after such an edit.
(An installed release changes every file, so users are not affected.)

Every kernel has a serial twin (:func:`serial`: the same source without
``parallel``); :func:`use_parallel` picks the version a call runs -- serial for
small tensors, one thread and forked processes (:data:`_parallel_ok`), where
numba's OpenMP pool must not start. Both give the same bits.

Also here, because several families need them: :func:`serves_cpu` (which
tensors the ``"cpu"`` backend takes), :func:`sync_threads` (numba uses as many
threads as torch) and :func:`rows_per_chunk` (fixed chunk boundaries for
reductions over rows, so results do not depend on the number of threads).
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing.process
import os
import threading
import types

import torch

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

CPU_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)

# Reductions over rows (dweight, dbias, later BatchNorm statistics) give each
# chunk of consecutive rows its own partial sum and merge the partials in chunk
# order. A chunk holds about CHUNK_ELEMS values and at least MIN_CHUNK_ROWS rows
# (so the partials stay small next to the input).
CHUNK_ELEMS = 65536
MIN_CHUNK_ROWS = 16

_numba = None
_threads = threading.local()  # .n: the thread count last given to numba on this thread


def available() -> bool:
    """Whether numba is installed (checked without importing it)."""
    return importlib.util.find_spec("numba") is not None


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


def helper(fn):
    """Decorator for a function that kernels call: ``numba.njit(**HELPER_OPTIONS)``."""
    return numba().njit(**HELPER_OPTIONS)(fn)


def serves_cpu(x: torch.Tensor) -> bool:
    """The ``"cpu"`` backend takes CPU tensors of the four float dtypes (numba installed)."""
    return x.is_cpu and x.dtype in CPU_DTYPES


# Below this many elements a kernel runs on the calling thread alone (torch's
# GRAIN_SIZE): waking a second thread costs more than the work, and on a busy
# machine a parallel region waits until every one of its threads gets a core.
SERIAL_ELEMS = 32768

# The kernels compiled with ``parallel=True`` (``@kernel``), and the serial twin of
# every function that reaches one (see :func:`serial`).
_PARALLEL: set = set()
_TWINS: dict = {}

# Whether this process may start parallel regions at all: not in a forked child.
# numba's OpenMP layer kills a child forked after its parent ran a parallel kernel
# ("Terminating: fork() called from a process already using GNU OpenMP, this is
# unsafe."), and libgomp, which torch shares, hangs a forked child's first
# parallel region when the parent's torch ops had started its pool. A forked
# child (DataLoader workers, fork pools, pre-forking servers) therefore runs
# every kernel through its serial twin: same source, same chunks, the same bits.
# A process that multiprocessing started (a DataLoader worker, a Pool worker, a
# Process) counts as such a child even when normlab is first imported there, after
# the fork: its parent may well have started torch's pool. (A child started by
# "spawn" is a fresh interpreter and would be safe; it is not told apart, and runs
# serially too -- the same bits, only large tensors are slower there.)
_parallel_ok = multiprocessing.process.parent_process() is None


def _after_fork_in_child() -> None:
    global _parallel_ok
    _parallel_ok = False
    _threads.__dict__.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


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


_forced: bool | None = None  # set by forced_version: every kernel in that version, whatever its size


@contextlib.contextmanager
def forced_version(parallel: bool):
    """Run every kernel in its parallel (``True``) or serial (``False``) version inside the
    block, whatever the size (``normlab.warmup`` compiles both on small tensors)."""
    global _forced
    before, _forced = _forced, bool(parallel)
    try:
        yield
    finally:
        _forced = before


def use_parallel(numel: int) -> bool:
    """Whether a kernel over ``numel`` values takes its parallel version (else its serial twin).

    Parallel when the tensor is large enough (:data:`SERIAL_ELEMS`), torch runs more
    than one thread, and this process may start a thread pool (not a child forked
    after its parent had started one). When it does, numba's thread count is made
    to match torch's (:func:`sync_threads`).
    """
    if _forced is not None:  # warmup: the version it is compiling
        if not (_forced and _parallel_ok):
            return False
    elif numel < SERIAL_ELEMS or not _parallel_ok or torch.get_num_threads() == 1:
        return False
    sync_threads()
    return True


def sync_threads() -> None:
    """Make numba's thread count (for this thread) match ``torch.get_num_threads()``.

    The last count set is remembered per thread, so the common call costs no
    numba call (a ``numba.set_num_threads`` made elsewhere is not noticed).
    """
    n_torch = torch.get_num_threads()
    if getattr(_threads, "n", None) != n_torch:  # numba's setting is per thread, like ours
        nb = numba()
        nb.set_num_threads(max(1, min(n_torch, nb.config.NUMBA_NUM_THREADS)))
        _threads.n = n_torch
        if torch.get_num_threads() != n_torch:
            # numba's "omp" layer shares libgomp with torch: starting its pool can
            # reset torch's count (seen by `normlab bench`); put it back
            torch.set_num_threads(n_torch)


def rows_per_chunk(n_rows: int, n_cols: int) -> int:
    """Rows per chunk for a reduction over ``n_rows`` rows of ``n_cols`` values.

    Depends on the shape only -- never on the number of threads -- so partial
    sums over chunks, merged in chunk order, are bitwise reproducible. Chunk
    ``c`` holds rows ``[c * rows, min((c + 1) * rows, n_rows))``.
    """
    rows = max(MIN_CHUNK_ROWS, -(-CHUNK_ELEMS // max(n_cols, 1)))  # ceil division
    return max(1, min(rows, n_rows))


def n_chunks(n_rows: int, rows: int) -> int:
    """Number of chunks of ``rows`` rows that cover ``n_rows`` rows."""
    return (n_rows + rows - 1) // rows
