"""The op side of the Numba boundary: what every family's launchers need to hand tensors to the kernels.

Imports neither numba nor a ``kernels.py`` until a kernel first runs (the
kernels' side -- compile options, decorators, serial twins -- is ``ops/_jit.py``).

- :func:`available`, :func:`serves_cpu`: whether numba is installed, and the
  tensors the ``"cpu"`` backend takes.
- :func:`kernels_loader`: the family's ``kernels.py`` (numba and all), imported
  on the first kernel call, so ``import normlab`` never imports numba; with the
  call's size, in the version that should run it (:func:`use_parallel`: the
  parallel kernels, or their serial twins for small tensors, one thread and
  forked processes; :func:`forced_version` for ``normlab warmup``), with
  numba's thread count matched to torch's (:func:`sync_threads`).
- :func:`rows_per_chunk`: fixed chunk boundaries for reductions over rows, so
  results do not depend on the number of threads.
- :func:`bits`: a numpy view of a tensor's storage, no copy. Numba has no
  bfloat16, so half tensors travel as their bits: bfloat16 as int16, float16 as
  uint16; the kernels convert them (``ops/_bf16.py``).
- the pointer path (``ops/_ptr.py`` on the kernels' side): :data:`PROTO` (the
  prototype arrays an entry function takes for a dtype), :func:`param_ptr`
  (a weight or bias as an address) and :func:`call` (a jitted function called
  through its compiled entry point).
- :func:`fast_apply`: an ``autograd.Function``'s apply without the Python layer
  of ``Function.apply``.
- :func:`empty_like`: the kernels' output buffers, large ones advised onto
  transparent huge pages.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import multiprocessing.process
import os
import sys
import threading
from typing import Callable, Optional

import numpy as np
import torch

from . import _jit

CPU_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def available() -> bool:
    """Whether numba is installed (checked without importing it)."""
    return importlib.util.find_spec("numba") is not None


def serves_cpu(x: torch.Tensor) -> bool:
    """The ``"cpu"`` backend takes CPU tensors of the four float dtypes (numba installed)."""
    return x.is_cpu and x.dtype in CPU_DTYPES


# --------------------------------------------------------------------------
# Which version of a kernel runs: parallel, or its serial twin
# --------------------------------------------------------------------------

# Below this many elements a kernel runs on the calling thread alone (torch's
# GRAIN_SIZE): waking a second thread costs more than the work, and on a busy
# machine a parallel region waits until every one of its threads gets a core.
SERIAL_ELEMS = 32768

_threads = threading.local()  # .n: the thread count last given to numba on this thread

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
        nb = _jit.numba()
        nb.set_num_threads(max(1, min(n_torch, nb.config.NUMBA_NUM_THREADS)))
        _threads.n = n_torch
        if torch.get_num_threads() != n_torch:
            # numba's "omp" layer shares libgomp with torch: starting its pool can
            # reset torch's count (seen by `normlab bench`); put it back
            torch.set_num_threads(n_torch)


# Reductions over rows (dweight, dbias, GroupNorm's NHWC statistics) give each
# chunk of consecutive rows its own partial sum and merge the partials in chunk
# order. A chunk holds about CHUNK_ELEMS values and at least MIN_CHUNK_ROWS rows
# (so the partials stay small next to the input).
CHUNK_ELEMS = 65536
MIN_CHUNK_ROWS = 16


def rows_per_chunk(n_rows: int, n_cols: int) -> int:
    """Rows per chunk for a reduction over ``n_rows`` rows of ``n_cols`` values.

    Depends on the shape only -- never on the number of threads -- so partial
    sums over chunks, merged in chunk order, are bitwise reproducible. Chunk
    ``c`` holds rows ``[c * rows, min((c + 1) * rows, n_rows))``.
    """
    rows = max(MIN_CHUNK_ROWS, -(-CHUNK_ELEMS // max(n_cols, 1)))  # ceil division
    return max(1, min(rows, n_rows))


# --------------------------------------------------------------------------
# The kernels modules
# --------------------------------------------------------------------------

_BITS = {torch.bfloat16: torch.int16, torch.float16: torch.uint16}


class _SerialKernels:
    """A kernels module seen through its serial twins (``_jit.serial``), looked up once each."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        twin = _jit.serial(getattr(self._module, name))
        setattr(self, name, twin)  # later lookups skip __getattr__
        return twin


# --------------------------------------------------------------------------
# Output buffers
# --------------------------------------------------------------------------

# Outputs of at least this many bytes are advised onto transparent huge pages (numpy's
# threshold for its own arrays, 4 MiB).
HUGE_MIN = 1 << 22
_PAGE = 4096
_MADV_HUGEPAGE = 14
_madvise = None  # libc's madvise, False where it is not used (see _huge_pages)


def _huge_pages():
    """libc's ``madvise`` where advising huge pages can help, else False (found once).

    Only on Linux with transparent huge pages in ``madvise`` mode (in ``always`` mode every
    large buffer gets them anyway, in ``never`` mode none does), and not with
    ``NORMLAB_HUGEPAGES=0``."""
    global _madvise
    if _madvise is None:
        _madvise = False
        try:
            with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
                mode = f.read()
            if "[madvise]" in mode and os.environ.get("NORMLAB_HUGEPAGES", "1") != "0":
                import ctypes
                fn = ctypes.CDLL(None, use_errno=True).madvise
                fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                fn.restype = ctypes.c_int
                _madvise = fn
        except (OSError, AttributeError):
            pass
    return _madvise


def empty_like(x: torch.Tensor, memory_format=torch.preserve_format) -> torch.Tensor:
    """``torch.empty_like(x, memory_format=...)``; a buffer of :data:`HUGE_MIN` bytes or more
    is first advised onto transparent huge pages (``madvise(MADV_HUGEPAGE)`` on the whole 4 KiB
    pages inside it), as numpy does for its arrays.

    Why: a fresh large buffer is faulted in page by page as the kernel first writes it. With
    4 KiB pages that is one fault per 4 KiB: allocating and writing 64 MB took 28-41 ms here
    against 9-15 ms advised (one thread; ``docs/performance.md``). The advice is a hint
    about memory this buffer owns: nothing is read or written, the values are the same, and
    where the kernel cannot find a huge page it uses small ones as before.
    """
    out = torch.empty_like(x, memory_format=memory_format)
    n = out.numel() * out.element_size()
    if n >= HUGE_MIN:
        advise = _huge_pages()
        if advise:
            start = out.data_ptr()
            lo = -(-start // _PAGE) * _PAGE
            hi = (start + n) // _PAGE * _PAGE
            advise(lo, hi - lo, _MADV_HUGEPAGE)  # a failure leaves the buffer as it was: ignored
    return out


def kernels_loader(package: str) -> Callable:
    """A function ``load(numel=None)`` returning ``<package>.kernels``, imported on its first call.

    With ``numel`` (the values a kernel will touch), the kernels come in the version
    that should run it (:func:`use_parallel`): the module's own, parallel ones
    for large tensors, their serial twins otherwise.
    """
    module = serial = None

    def load(numel: Optional[int] = None):
        nonlocal module, serial
        if module is None:
            module = importlib.import_module(package + ".kernels")
            serial = _SerialKernels(module)
        if numel is None or use_parallel(numel):
            return module
        return serial

    return load


def bits(t: torch.Tensor):
    """A numpy view of ``t``'s storage: bfloat16 as int16 bits, float16 as uint16 bits."""
    if t.requires_grad:
        t = t.detach()
    as_bits = _BITS.get(t.dtype)
    return (t if as_bits is None else t.view(as_bits)).numpy()


# --------------------------------------------------------------------------
# The pointer path
# --------------------------------------------------------------------------

_STORAGE = {torch.float32: np.float32, torch.float64: np.float64, torch.bfloat16: np.int16,
            torch.float16: np.uint16}
# torch dtype -> (prototype of the storage dtype, prototype of the accumulation dtype)
PROTO = {dt: (np.zeros(1, st), np.zeros(1, np.float64 if dt == torch.float64 else np.float32))
         for dt, st in _STORAGE.items()}


def param_ptr(p: Optional[torch.Tensor], acc: torch.dtype):
    """``(address, keep)`` of a weight or bias as a contiguous tensor in dtype ``acc``: the
    address is 0 for None (the entry functions then use ones / zeros); ``keep`` holds a
    converted copy alive until the kernel has run."""
    if p is None:
        return 0, None
    if p.dtype != acc or not p.is_contiguous():
        p = p.detach().to(acc).contiguous()
    return p.data_ptr(), p


_ENTRIES: dict = {}  # (jitted function, key) -> its compiled entry point


def call(fn, key, *args):
    """``fn(*args)`` for a jitted ``fn``, straight through its compiled entry point.

    A call through numba's dispatcher types every argument first (~0.15 us each);
    the entry point of the one compiled version skips that. ``key`` must fix the
    type of every argument (the launchers use the input's dtype and pass Python
    ints, floats and bools, and prototype arrays from :data:`PROTO`): the first
    call for a key goes through the dispatcher (compiling, or loading from the
    disk cache) and remembers the entry point it used.
    """
    entry = _ENTRIES.get((fn, key))
    if entry is not None:
        return entry(*args)
    sig = tuple(fn.typeof_pyval(a) for a in args)
    if sig not in fn.overloads and not _on_disk(fn, sig):
        _announce(fn, key)
    out = fn(*args)
    compiled = fn.overloads.get(sig)
    if compiled is not None:
        _ENTRIES[(fn, key)] = compiled.entry_point
    return out


def _on_disk(fn, sig) -> bool:
    """Whether numba's disk cache holds ``fn`` compiled for ``sig`` (True when it cannot tell).

    Reads the cache index only (a small file), through numba's internals; any
    change there makes this answer True, which only silences :func:`_announce`.
    """
    try:
        cache = fn._cache
        key = cache._index_key(sig, fn.targetctx.codegen())
        return key in cache._cache_file._load_index()
    except Exception:  # pragma: no cover - numba internals moved
        return True


def _announce(fn, key) -> None:
    """One line on stderr before a kernel compiles (seconds, once per install and dtype)."""
    name = fn.py_func.__name__.replace("__serial", "").removesuffix("_at")
    kind = "serial " if fn.py_func.__qualname__.endswith("__serial") else (
        "parallel " if _jit._reaches_kernel(fn) else "")
    sys.stderr.write(
        f"normlab: compiling the {kind}{name} kernel for {str(key).replace('torch.', '')} "
        f"(first use in this install: takes seconds, then cached on disk; "
        f"`normlab warmup` compiles every kernel ahead)\n"
    )
    sys.stderr.flush()


def fast_apply(function: type) -> Callable:
    """``function.apply`` (an ``autograd.Function``) without ``Function.apply``'s Python layer.

    ``Function.apply`` binds default arguments and walks the arguments for
    functorch wrappers before it calls the C++ apply (about 4 us a call here).
    With no functorch transform active -- always, for the eager path -- the C++
    apply alone does the same; under a transform the full ``apply`` runs.
    """
    c_apply = super(torch.autograd.Function, function).apply
    full_apply = function.apply
    active = torch._C._are_functorch_transforms_active

    def apply(*args):
        return full_apply(*args) if active() else c_apply(*args)

    return apply
