"""The gate: the one function that decides which path a call takes, and the backend choice it reads.

Every public entry (``normlab.functional``, and through it ``normlab.nn``) asks :func:`route`
once and dispatches on its answer, one of four paths:

- :data:`REF`: the reference math in torch ops (``ops/<family>/reference.py``): backend ``"ref"``;
  every device and dtype; also every call while ``torch.export`` or ``torch.jit.trace`` records
  (the exported graph holds aten ops, which every runtime it goes to can run);
- :data:`EAGER`: the C++ kernels (backend ``"cpu"``) called directly, autograd recorded by C++;
- :data:`TRANSFORM`: the C++ kernels under torch.func transforms or forward-mode AD, through each
  family's transform ``autograd.Function`` (vmap and jvp rules), which a C++ node cannot be;
- :data:`COMPILE`: the C++ kernels as the ``torch.ops.normlab`` custom ops ``torch.compile`` traces.

Backends: ``"ref"`` (serves every device and dtype), ``"cpu"`` (CPU tensors of the four float
dtypes, where the C++ extension is installed), ``"auto"`` (``"cpu"`` where it serves the tensor,
else ``"ref"``; the default). An explicit ``"cpu"`` that cannot serve a tensor raises an error
listing what can. The choice, in order of precedence: :func:`use_backend` (a context manager,
this thread), :func:`set_backend`, the ``NORMLAB_BACKEND`` environment variable (read once, at
import; validated at the first call that uses it), ``"auto"``.

:func:`backend_for` reports what a call would use by asking :func:`route` itself, so it is true
by construction.
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator

import torch
import torch.autograd.forward_ad as _fwad

# The paths (small ints: compared with ``==`` on every call)
REF = 0
EAGER = 1
TRANSFORM = 2
COMPILE = 3

# The ops every backend implements (the names backend_for and its error messages use)
OPS = frozenset({"layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm", "layer_norm2d", "batch_norm",
                 "group_norm", "instance_norm", "sync_batch_norm", "dyt", "local_response_norm",
                 "rms_norm2d", "simple_norm", "simple_norm2d", "filter_response_norm", "evo_norm2d_b0",
                 "evo_norm2d_s0",
                 "batch_norm_act", "group_norm_act", "layer_norm_act", "layer_norm_act2d"})
# The ops with no C++ kernel: every path runs their reference math (backend_for says "ref")
REFERENCE_ONLY_OPS = frozenset({"local_response_norm", "simple_norm", "evo_norm2d_b0", "evo_norm2d_s0"})

_SERVED = (torch.float32, torch.float64, torch.bfloat16, torch.float16)  # the "cpu" kernels' dtypes
# "cpu" joins when normlab.ops finds the C++ extension installed (install_cpu, at import)
_CPU = False
_BACKENDS: tuple[str, ...] = ("ref",)
# Backends normlab knows but this install may lack, and what brings each one.
_MISSING = {
    "cpu": "the C++ extension normlab._C, which this install lacks (installed with "
           "NORMLAB_NO_EXTENSION=1, or without a C++ compiler); reinstall with "
           "`pip install --no-build-isolation --force-reinstall --no-deps .` from normlab's source, "
           "or use 'auto' (takes 'ref')",
}


class _State(threading.local):
    choice: str | None = None  # a class default: reading it unset raises nothing (no AttributeError to catch)


_state = _State()
_global_choice: str | None = None
_ENV_CHOICE = os.environ.get("NORMLAB_BACKEND", "").strip() or "auto"  # see get_backend

_functorch_active = torch._C._are_functorch_transforms_active
_is_compiling = torch.compiler.is_compiling
_is_exporting = torch.compiler.is_exporting
_is_tracing = torch._C._is_tracing


def install_cpu() -> None:
    """Make backend ``"cpu"`` available: called once by ``normlab.ops`` when the C++ extension loads."""
    global _CPU, _BACKENDS
    _CPU, _BACKENDS = True, ("ref", "cpu")


def available_backends() -> list[str]:
    """Names a user may request: ``"auto"`` and every backend this install has."""
    return ["auto", *_BACKENDS]


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
    previous = _state.choice
    _state.choice = name
    try:
        yield
    finally:
        _state.choice = previous


def get_backend() -> str:
    """The backend currently requested (may be ``"auto"``)."""
    choice = _state.choice or _global_choice
    if choice is None:
        # read at import, not per call: route runs before every kernel, and a lookup in
        # os.environ costs microseconds there
        choice = _validate(_ENV_CHOICE)
    return choice


def transforming() -> bool:
    """Whether a torch.func transform (vmap, grad, jvp, jacrev, ...) or forward-mode AD is active."""
    return _functorch_active() or _fwad._current_level >= 0


def route(x, op: str) -> int:
    """The path of a call of ``op`` on ``x`` now: :data:`REF`, :data:`EAGER`, :data:`TRANSFORM` or
    :data:`COMPILE` -- the one place this is decided.

    ``"ref"`` chosen, or ``torch.export``/``torch.jit.trace`` recording: REF. Otherwise the
    ``"cpu"`` kernels where they serve ``x``, a CPU tensor: TRANSFORM under a torch.func transform
    or forward-mode AD, COMPILE while torch.compile traces, EAGER otherwise. A tensor on another
    device: REF under ``"auto"``; under an explicit ``"cpu"`` a ``RuntimeError`` listing the
    backends that can (for a floating-point one). A tensor of a dtype no kernel serves (an
    integer, a complex) is refused by the argument checks on every path, as torch refuses it;
    ``x`` that is not a tensor: REF, whose checks say what is wrong.
    """
    choice = _state.choice or _global_choice or _ENV_CHOICE
    if choice != "auto":
        if choice == "ref":
            return REF
        if choice != "cpu":
            _validate(choice)  # NORMLAB_BACKEND's bad name: raises
    # (the dtype is not asked here: a CPU tensor of a dtype the kernels do not serve -- an integer,
    # a complex, a float8 -- is refused by the argument checks on every path, as by torch's)
    try:
        served = _CPU and x.is_cpu
    except AttributeError:  # not a tensor: the reference's argument checks say what is wrong
        return REF
    if not served:
        # an explicit "cpu" that cannot serve a floating-point tensor (another device) says so here;
        # a tensor of another dtype goes on to the argument checks, which refuse it as torch does
        if (choice == "cpu" and isinstance(x, torch.Tensor) and x.is_floating_point()
                and not (_is_exporting() or _is_tracing())):
            _cannot_serve(choice, x, op)
        return REF
    if _fwad._current_level >= 0 or _functorch_active():
        return TRANSFORM
    if _is_compiling():
        return REF if _is_exporting() else COMPILE
    return REF if _is_tracing() else EAGER


def backend_for(x: torch.Tensor, op: str) -> str:
    """The backend that would run ``op`` (``"layer_norm"``, ``"batch_norm"``, ...) on ``x`` now,
    under the current choice (what :func:`route` decides); raises ``RuntimeError`` when an
    explicitly chosen backend cannot serve ``x`` (the message lists the backends that can)."""
    if op not in OPS:
        raise ValueError(f"normlab: unknown op {op!r}; expected one of {sorted(OPS)}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"normlab.backend_for: expected a torch.Tensor, got {type(x).__name__}")
    if route(x, op) == REF or x.dtype not in _SERVED or op in REFERENCE_ONLY_OPS:
        # (a dtype no path accepts, or an op with no kernel: "ref", which serves all)
        return "ref"
    return "cpu"


def _cannot_serve(choice: str, x: torch.Tensor, op: str) -> None:
    raise RuntimeError(
        f"normlab {op}: backend {choice!r} cannot serve a {x.dtype} tensor on {x.device}; "
        f"backends that can: ['ref'] (or 'auto')"
    )
