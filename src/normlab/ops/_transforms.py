"""torch.func transforms and forward-mode AD on the ``"cpu"`` kernels: what every family's rules share.

The eager paths hand tensors to the kernels by address, which a functorch
``BatchedTensor`` or a dual tensor of forward-mode AD does not have. While a
transform is active (the path ``normlab._backend.route`` calls ``TRANSFORM``), each
family's entry point calls its transform ``autograd.Function`` instead: ``forward`` without ``ctx`` (runs the
kernels on plain tensors), ``setup_context``, ``backward`` (the kernels, or the
differentiable reference under ``create_graph``, which is what ``grad`` and
``vjp`` use), a hand-derived ``jvp`` (``ops/forward_mode.x_hat_jvp``) and a ``vmap``
rule that maps the batch dim onto the op -- more rows for LayerNorm, more
channels for BatchNorm, more samples for GroupNorm -- so a vmapped call runs
the kernel once, never a loop over the batch.
"""

from __future__ import annotations

import torch

from .. import _backend

# Whether a torch.func transform (vmap, grad, jvp, jacrev, ...) or forward-mode AD is active:
# the gate's own test (normlab._backend.route's TRANSFORM), not a second spelling of it
active = _backend.transforming


def front(t: torch.Tensor | None, bdim, batch: int) -> torch.Tensor | None:
    """``t`` with its batch dim first (``bdim`` None: the unbatched ``t`` expanded to ``batch``)."""
    if t is None:
        return None
    if bdim is None:
        return t.expand(batch, *t.shape)
    return t.movedim(bdim, 0)


def differentiable_backward() -> bool:
    """Whether a backward must run in differentiable torch ops (the reference backward, with the
    statistics recomputed as functions of ``x``): under ``create_graph=True``, and under any
    transform or forward-mode AD, which differentiate the backward itself (``hessian``,
    ``jacfwd(jacrev)``) even where grad mode is off."""
    return torch.is_grad_enabled() or active()


_WITH_JVP: dict = {}


def pick(function: type) -> type:
    """The reference ``autograd.Function`` to apply: ``function`` itself, or while a transform is
    active its twin with the forward-mode rule (``function._jvp`` as ``jvp``).

    Dynamo does not trace a Function that defines ``jvp`` (a graph break, so no
    ``fullgraph=True``); the plain class, whose ``jvp`` is torch's default, serves
    ``torch.compile`` and the eager path.
    """
    if not active():
        return function
    twin = _WITH_JVP.get(function)
    if twin is None:
        twin = _WITH_JVP[function] = type(function.__name__, (function,), {"jvp": staticmethod(function._jvp)})
    return twin
