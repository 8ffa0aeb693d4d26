"""The Python side of op registration: what the C++ ops (``csrc/``) cannot do themselves.

- :func:`transform`: the Python ``autograd.Function`` that runs an op under torch.func
  transforms and forward-mode AD (a C++ autograd node refuses them), with its ``vmap`` and
  ``jvp`` rules (the path ``normlab._backend.route`` calls ``TRANSFORM``).
- :func:`custom_op`, :func:`eager`: for SyncBatchNorm (``batch_norm/sync.py``), whose
  collectives run in Python: its ``torch.library`` ops and its eager Function.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

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
