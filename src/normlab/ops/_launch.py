"""What every family's ``op.py`` needs to hand tensors to its Numba kernels.

- :func:`kernels_loader`: the family's ``kernels.py`` (numba and all), imported
  on the first kernel call, so ``import normlab`` never imports numba.
- :func:`bits`: a numpy view of a tensor's storage, no copy. Numba has no
  bfloat16, so half tensors travel as their bits: bfloat16 as int16, float16 as
  uint16; the kernels convert them (``ops/_bf16.py``).
- the pointer path (``ops/_ptr.py``): :data:`PROTO` (the
  prototype arrays an entry function takes for a dtype), :func:`param_ptr`
  (a weight or bias as an address) and :func:`call` (a jitted function called
  through its compiled entry point).
- :func:`fast_apply`: an ``autograd.Function``'s apply without the Python layer
  of ``Function.apply``; :func:`records`: whether autograd records a call (else
  the launcher runs without a Function).
"""

from __future__ import annotations

import importlib
import sys
from typing import Callable, Optional

import numpy as np
import torch

from . import _numba

_BITS = {torch.bfloat16: torch.int16, torch.float16: torch.uint16}


class _SerialKernels:
    """A kernels module seen through its serial twins (``_numba.serial``), looked up once each."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        twin = _numba.serial(getattr(self._module, name))
        setattr(self, name, twin)  # later lookups skip __getattr__
        return twin


def kernels_loader(package: str) -> Callable:
    """A function ``load(numel=None)`` returning ``<package>.kernels``, imported on its first call.

    With ``numel`` (the values a kernel will touch), the kernels come in the version
    that should run it (``_numba.use_parallel``): the module's own, parallel ones
    for large tensors, their serial twins otherwise.
    """
    module = serial = None

    def load(numel: Optional[int] = None):
        nonlocal module, serial
        if module is None:
            module = importlib.import_module(package + ".kernels")
            serial = _SerialKernels(module)
        if numel is None or _numba.use_parallel(numel):
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
        "parallel " if _numba._reaches_kernel(fn) else "")
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


def records(*tensors) -> bool:
    """Whether autograd records a call on ``tensors`` (None allowed): grad mode is on and one
    of them requires grad. When it does not, the eager paths run the launcher alone (~10 us
    less than an ``autograd.Function``)."""
    if not torch.is_grad_enabled():
        return False
    for t in tensors:
        if t is not None and t.requires_grad:
            return True
    return False
