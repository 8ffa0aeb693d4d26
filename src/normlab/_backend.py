"""Backend choice: which implementation of an op serves a tensor.

Backends by name:

- ``"ref"``  -- the reference math in plain torch ops (``ops/<family>/reference.py``);
  serves every device and dtype.
- ``"auto"`` -- the fastest registered backend that serves the tensor (the default).

While ``torch.export`` (and ``torch.onnx.export``) or ``torch.jit.trace`` records
a model, every call resolves to ``"ref"``: the recorded graph then holds aten ops
that any runtime can run, where a kernel call would be opaque (or invisible).

Further backends (fused CPU kernels) register themselves with
:func:`register_backend`, naming the ops they implement: ``"cpu"`` is
registered by each ``ops`` family for the ops it has kernels for
(``ops/layer_norm``: ``layer_norm``, ``rms_norm``, ``add_layer_norm``,
``add_rms_norm``; ``ops/batch_norm``: ``batch_norm``; ``ops/group_norm``:
``group_norm``, ``instance_norm``). An explicit request that cannot serve a tensor (or does not implement the op)
raises an error that lists what is available.

The choice comes from, in order of precedence: :func:`use_backend` (a context
manager), :func:`set_backend`, the ``NORMLAB_BACKEND`` environment variable (read
once, when normlab is imported; validated at the first call that uses it), and
finally ``"auto"``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Callable, Iterable, Iterator

import torch

# name -> predicate "can this backend serve this tensor?"; kept in priority order
# (first registered = lowest priority, so "auto" walks the list backwards).
_BACKENDS: dict[str, Callable[[torch.Tensor], bool]] = {"ref": lambda x: True}
# name -> the ops it implements (None: every op)
_OPS: dict[str, frozenset[str] | None] = {"ref": None}

_state = threading.local()
_global_choice: str | None = None
_ENV_CHOICE = os.environ.get("NORMLAB_BACKEND", "").strip() or "auto"  # see get_backend
# op -> the predicates of the backends implementing it, highest priority first
# ("auto"'s walk, precomputed: resolve runs before every call)
_AUTO: dict[str, tuple[tuple[str, Callable[[torch.Tensor], bool]], ...]] = {}


def register_backend(
    name: str, serves: Callable[[torch.Tensor], bool], ops: Iterable[str] | None = None
) -> None:
    """Make backend ``name`` available; ``serves(x)`` tells whether it can run on ``x``.

    ``ops`` names the ops it implements (``None``: every op). Registering a
    name again adds its ``ops`` to those already registered (each family
    registers the kernels it has) and replaces ``serves``.
    """
    ops = frozenset(ops) if ops is not None else None
    if name in _OPS:
        before = _OPS[name]
        ops = None if before is None or ops is None else before | ops
    _BACKENDS[name] = serves
    _OPS[name] = ops
    _AUTO.clear()


def _auto_order(op: str) -> tuple[tuple[str, Callable[[torch.Tensor], bool]], ...]:
    order = _AUTO.get(op)
    if order is None:
        order = _AUTO[op] = tuple(
            (n, _BACKENDS[n]) for n in reversed(list(_BACKENDS)) if _OPS[n] is None or op in _OPS[n]
        )
    return order


def _serves(name: str, x: torch.Tensor, op: str) -> bool:
    ops = _OPS.get(name)
    return (ops is None or op in ops) and _BACKENDS[name](x)


def available_backends() -> list[str]:
    """Names a user may request: ``"auto"`` and every registered backend."""
    return ["auto", *_BACKENDS]


def _validate(name: str) -> str:
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
        # read at import, not per call: resolve runs before every kernel, and a
        # lookup in os.environ costs microseconds there
        choice = _validate(_ENV_CHOICE)
    return choice


def backend_for(x: torch.Tensor, op: str) -> str:
    """The backend that would run ``op`` (``"layer_norm"``, ``"batch_norm"``, ...) on ``x`` now,
    under the current choice; raises ``RuntimeError`` when an explicitly chosen backend cannot
    serve ``x`` (the message lists the backends that can)."""
    return resolve(x, op)


def resolve(x: torch.Tensor, op: str) -> str:
    """The concrete backend that will run ``op`` on ``x``.

    Raises ``RuntimeError`` when an explicitly requested backend cannot serve ``x``.
    """
    choice = get_backend()
    if torch.compiler.is_exporting() or torch.jit.is_tracing():
        # torch.export (and torch.onnx.export, which runs it) and torch.jit.trace (the older
        # ONNX exporter): the reference math in aten ops, which every runtime an exported
        # program goes to can run; a kernel call is opaque there (and invisible to a trace)
        return "ref"
    if choice == "auto":
        for name, serves in _auto_order(op):
            if serves(x):
                return name
        return "ref"  # pragma: no cover - "ref" serves everything
    if not _serves(choice, x, op):
        serving = [n for n in _BACKENDS if _serves(n, x, op)]
        ops = _OPS.get(choice)
        what = (
            f"does not implement {op}" if ops is not None and op not in ops
            else f"cannot serve a {x.dtype} tensor on {x.device}"
        )
        raise RuntimeError(
            f"normlab {op}: backend {choice!r} {what}; backends that can: {serving} (or 'auto')"
        )
    return choice
