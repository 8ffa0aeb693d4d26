"""The Python side of op registration: what the C++ ops (``csrc/``) cannot do themselves.

- :func:`implement`: an op's entries in the backend table (``_backend``): ``"ref"`` from the
  family's ``reference.py``, ``"cpu"`` from its ``op.py`` when the extension is installed.
- :func:`transform` and :func:`route`: the Python ``autograd.Function`` that runs an op under
  torch.func transforms and forward-mode AD (a C++ autograd node refuses them), with its
  ``vmap`` and ``jvp`` rules, and the rule that picks it.
- :func:`custom_op`, :func:`eager`: for SyncBatchNorm (``batch_norm/sync.py``), whose
  collectives run in Python: its ``torch.library`` ops and its eager Function.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.autograd.forward_ad as _fwad

from .. import _backend
from . import extension

# --------------------------------------------------------------------------
# Which path runs a call
# --------------------------------------------------------------------------

FUNCTION = 0  # an autograd.Function runs the call: a torch.func transform or forward-mode AD
               # is active (the <Name>Transform Function), or autograd records it (<Name>Eager)
COMPILE = 1  # torch.compile is tracing: the custom ops
PLAIN = 2  # nothing to record (no_grad, inference, no input needs a gradient): the op call alone

_functorch_active = torch._C._are_functorch_transforms_active
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled


def route(*tensors: Optional[torch.Tensor]) -> int:
    """The path of a call on ``tensors`` (None allowed): :data:`FUNCTION`, :data:`COMPILE` or
    :data:`PLAIN`.

    A kernel gets tensors by address, which a functorch ``BatchedTensor`` or a
    dual tensor has not: transforms come first (FUNCTION), also while compiling. Without
    a transform, ``torch.compile`` traces the custom ops; an eager call takes
    a Function only when autograd records it (grad mode on and an
    input that requires grad), else the op call alone (no Function to build).
    """
    if _functorch_active() or _fwad._current_level >= 0:
        return FUNCTION
    if _is_compiling():
        return COMPILE
    if _grad_enabled():
        for t in tensors:
            if t is not None and t.requires_grad:
                return FUNCTION
    return PLAIN


# --------------------------------------------------------------------------
# The three forms of an op
# --------------------------------------------------------------------------


def custom_op(
    name: str,
    fn: Callable,
    *,
    fake: Callable,
    backward: Optional[Callable] = None,
    setup_context: Optional[Callable] = None,
    mutates_args: tuple[str, ...] = (),
    device_types: Optional[str] = "cpu",
):
    """``fn`` as the custom op ``normlab::<name>`` (on CPU; ``device_types=None``: any device),
    with its ``fake`` (shapes only) and, when ``backward`` is given, its autograd formula
    (``setup_context`` saves what it needs).

    The schema comes from ``fn``'s type hints (so the module defining ``fn`` does not use
    ``from __future__ import annotations``). A mutating op (``mutates_args``) can carry no
    autograd formula: the running-statistics updates are ops of their own.
    """
    op = torch.library.custom_op(f"normlab::{name}", fn, mutates_args=mutates_args, device_types=device_types)
    op.register_fake(fake)
    if backward is not None:
        op.register_autograd(backward, setup_context=setup_context)
    return op


def fast_apply(function: type) -> Callable:
    """``function.apply`` (an ``autograd.Function``) without ``Function.apply``'s Python layer
    (argument binding and a walk for functorch wrappers) when no functorch
    transform is active; under a transform the full ``apply`` runs."""
    c_apply = super(torch.autograd.Function, function).apply
    full_apply = function.apply
    active = torch._C._are_functorch_transforms_active

    def apply(*args):
        return full_apply(*args) if active() else c_apply(*args)

    return apply


def eager(name: str, forward: Callable, backward: Callable, doc: str = "") -> Callable:
    """The apply of ``<name>Eager``, the autograd.Function of the eager calls: ``forward(ctx, ...)``
    runs the forward computation, ``backward(ctx, *grads)`` the backward one (or, under
    ``create_graph=True``, the differentiable reference). Applied through the C++ apply when no
    functorch transform is active (:func:`fast_apply`)."""
    cls = type(f"{name}Eager", (torch.autograd.Function,), {
        "forward": staticmethod(forward), "backward": staticmethod(backward),
        "__doc__": doc or f"{name} on the kernels, for eager calls that autograd records.",
        "__module__": forward.__module__,
    })
    return fast_apply(cls)


def transform(
    name: str,
    *,
    forward: Callable,
    setup_context: Callable,
    backward: Callable,
    jvp: Callable,
    vmap: Callable,
    doc: str = "",
) -> type:
    """``<name>Transform``: the autograd.Function for torch.func transforms and forward-mode AD.

    ``forward`` (no ``ctx``) runs the ops on plain tensors; ``setup_context`` saves for
    the backward and for ``jvp`` (``ctx.save_for_forward``); ``vmap(info, in_dims, *args)``
    maps the batch dim onto the op (more rows, channels or samples: one kernel call, never a
    loop over the batch). The class is returned; its ``apply`` is the call.
    """
    return type(f"{name}Transform", (torch.autograd.Function,), {
        "forward": staticmethod(forward), "setup_context": staticmethod(setup_context),
        "backward": staticmethod(backward), "jvp": staticmethod(jvp), "vmap": staticmethod(vmap),
        "__doc__": doc or f"{name} on the kernels under torch.func transforms and forward-mode AD.",
        "__module__": forward.__module__,
    })


# --------------------------------------------------------------------------
# The backend table and the running buffers
# --------------------------------------------------------------------------


def implement(op: str, *, ref: Callable, cpu: Optional[Callable] = None) -> None:
    """Enter ``op`` in the backend table: ``ref`` (from the family's ``reference.py``) on
    ``"ref"``, ``cpu`` (from its ``op.py``) on ``"cpu"`` when the C++ extension is installed
    (``extension.available()``). Both take the arguments ``normlab.functional`` has checked."""
    _backend.register_op(op, "ref", ref)
    if cpu is not None and extension.available():
        _backend.register_backend("cpu", extension.serves_cpu)
        _backend.register_op(op, "cpu", cpu)

