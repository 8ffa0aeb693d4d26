"""Backend choice: the table (op, backend) -> function, and which backend serves a call.

The ``ops`` families enter their functions with :func:`register_op` when imported; callers
ask :func:`implementation` for the function that runs an op on a tensor now. Backends:
``"ref"`` (serves every device and dtype), ``"cpu"`` (CPU tensors of the four float dtypes,
where the C++ extension is installed), ``"auto"`` (the last registered backend that serves
the tensor; the default). While ``torch.export`` or ``torch.jit.trace`` records, every call
resolves to ``"ref"``. An explicit request that cannot serve a tensor raises an error listing
what can.

The choice, in order of precedence: :func:`use_backend` (a context manager, this thread),
:func:`set_backend`, the ``NORMLAB_BACKEND`` environment variable (read once, at import;
validated at the first call that uses it), ``"auto"``.
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Callable, Iterator

import torch
import torch.autograd.forward_ad as _fwad

# name -> predicate "can this backend serve this tensor?"; kept in priority order
# (first registered = lowest priority, so "auto" walks the list backwards).
_BACKENDS: dict[str, Callable[[torch.Tensor], bool]] = {"ref": lambda x: True}
# (op, backend) -> the function that runs op on that backend: the one table
_IMPL: dict[tuple[str, str], Callable] = {}

class _State(threading.local):
    choice: str | None = None  # a class default: reading it unset raises nothing (no AttributeError to catch)


_state = _State()
_global_choice: str | None = None
_ENV_CHOICE = os.environ.get("NORMLAB_BACKEND", "").strip() or "auto"  # see get_backend
# op -> (name, predicate, function) of the backends implementing it, highest priority
# first ("auto"'s walk, precomputed: it runs before every call)
_AUTO: dict[str, tuple[tuple[str, Callable[[torch.Tensor], bool], Callable], ...]] = {}


def register_backend(name: str, serves: Callable[[torch.Tensor], bool]) -> None:
    """Make backend ``name`` available; ``serves(x)`` tells whether it can run on ``x``.

    Registering a name again replaces ``serves`` (its priority stays). The ops it
    implements are its entries in the table (:func:`register_op`).
    """
    _BACKENDS[name] = serves
    _AUTO.clear()


def register_op(op: str, backend: str, fn: Callable) -> None:
    """Enter ``fn`` in the table as ``op`` on ``backend`` (a registered backend)."""
    if backend not in _BACKENDS:
        raise ValueError(f"normlab: register backend {backend!r} before its ops")
    _IMPL[(op, backend)] = fn
    _AUTO.clear()


def function(op: str, backend: str) -> Callable:
    """The table's entry for ``op`` on ``backend`` (a name :func:`backend_for` gave): for ops whose
    custom ops carry the backend's name, to find their implementation again inside."""
    return _IMPL[(op, backend)]


def _auto_order(op: str):
    order = _AUTO.get(op)
    if order is None:
        order = _AUTO[op] = tuple(
            (n, _BACKENDS[n], _IMPL[(op, n)]) for n in reversed(list(_BACKENDS)) if (op, n) in _IMPL
        )
    return order


def _serves(name: str, x: torch.Tensor, op: str) -> bool:
    serves = _BACKENDS.get(name)
    return serves is not None and (op, name) in _IMPL and serves(x)


def available_backends() -> list[str]:
    """Names a user may request: ``"auto"`` and every registered backend."""
    return ["auto", *_BACKENDS]


# Backends normlab knows but this install may lack, and what brings each one.
_MISSING = {
    "cpu": "the C++ extension normlab._C, which this install lacks (installed with "
           "NORMLAB_NO_EXTENSION=1, or without a C++ compiler); reinstall with "
           "`pip install --no-build-isolation --force-reinstall --no-deps .` from normlab's source, "
           "or use 'auto' (takes 'ref')",
}


def _validate(name: str) -> str:
    if isinstance(name, str) and name in _MISSING and name not in _BACKENDS:
        raise ValueError(f"normlab: backend {name!r} needs {_MISSING[name]}")
    if not isinstance(name, str) or (name != "auto" and name not in _BACKENDS):
        raise ValueError(
            f"normlab: unknown backend {name!r}; expected one of {available_backends()}"
        )
    return name


def set_backend(name: str) -> None:
    """Set the process-wide backend (``"auto"``, ``"ref"``, ...)."""
    global _global_choice
    _global_choice = _validate(name)


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Use backend ``name`` inside a ``with`` block (this thread only)."""
    _validate(name)
    previous = getattr(_state, "choice", None)
    _state.choice = name
    try:
        yield
    finally:
        _state.choice = previous


def get_backend() -> str:
    """The backend currently requested (may be ``"auto"``)."""
    choice = getattr(_state, "choice", None) or _global_choice
    if choice is None:
        # read at import, not per call: backend_for runs before every kernel, and a
        # lookup in os.environ costs microseconds there
        choice = _validate(_ENV_CHOICE)
    return choice


def _exporting() -> bool:
    # torch.export (and torch.onnx.export, which runs it) and torch.jit.trace (the older ONNX
    # exporter): the reference math in aten ops, which every runtime an exported program goes
    # to can run; a kernel call is opaque there (and invisible to a trace)
    return torch.compiler.is_exporting() or torch.jit.is_tracing()


_functorch_active = torch._C._are_functorch_transforms_active
_is_compiling = torch.compiler.is_compiling
_is_exporting = torch.compiler.is_exporting
_is_tracing = torch._C._is_tracing


def eager_cpu() -> bool:
    """Whether a plain eager call on a CPU tensor goes to ``"cpu"`` now: the choice is ``"auto"``
    or ``"cpu"``, the backend is installed, and no transform, forward-mode AD, compile, export or
    trace is running. ``normlab.functional``'s fast paths ask this before the C++ entry points
    (which check the arguments themselves and decline what they do not serve)."""
    choice = _state.choice or _global_choice or _ENV_CHOICE
    return ((choice == "auto" or choice == "cpu") and "cpu" in _BACKENDS and not _functorch_active()
            and _fwad._current_level < 0 and not _is_compiling() and not _is_exporting() and not _is_tracing())


def backend_for(x: torch.Tensor, op: str) -> str:
    """The backend that would run ``op`` (``"layer_norm"``, ``"batch_norm"``, ...) on ``x`` now,
    under the current choice; raises ``RuntimeError`` when an explicitly chosen backend cannot
    serve ``x`` (the message lists the backends that can)."""
    choice = get_backend()
    if _exporting():
        return "ref"
    if choice == "auto":
        for name, serves, _ in _auto_order(op):
            if serves(x):
                return name
        return "ref"  # pragma: no cover - "ref" serves everything
    _check_explicit(choice, x, op)
    return choice


def implementation(x: torch.Tensor, op: str) -> Callable:
    """The function of the table that runs ``op`` on ``x`` now (the backend :func:`backend_for` picks)."""
    choice = get_backend()
    if choice == "auto" and not _exporting():
        for _, serves, fn in _auto_order(op):
            if serves(x):
                return fn
    return _IMPL[(op, backend_for(x, op))]


def _check_explicit(choice: str, x: torch.Tensor, op: str) -> None:
    if not _serves(choice, x, op):
        serving = [n for n in _BACKENDS if _serves(n, x, op)]
        what = (
            f"does not implement {op}" if (op, choice) not in _IMPL
            else f"cannot serve a {x.dtype} tensor on {x.device}"
        )
        raise RuntimeError(
            f"normlab {op}: backend {choice!r} {what}; backends that can: {serving} (or 'auto')"
        )
