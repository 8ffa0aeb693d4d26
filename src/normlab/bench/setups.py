"""``normlab bench``'s setup factories: for one case, the tensors (built once) and what each
provider runs on them, and the "limit" copies that move the op's minimal bytes
(:func:`make_setup`; the cases and the byte accounting are in :mod:`normlab.bench.cases`)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from normlab._backend import use_backend
import normlab.functional as NF
from normlab.ops import extension

from .cases import (_NORMLAB_NAME, EPS, LN2D_EPS, MODES, MOMENTUM, PROVIDERS, RMS_EPS, Candidate, Case, _normlab_fn,
                    min_bytes, normlab_unavailable, num_groups, traffic)

# --------------------------------------------------------------------------
# The limit: copies that move the minimal bytes
# --------------------------------------------------------------------------

def _copy_kernel(reads: int, writes: int, pool: Sequence[torch.Tensor]) -> Callable[[], Any]:
    """A plain copy reading ``reads`` and writing ``writes`` tensors of ``pool[0]``'s size."""
    if len(pool) < reads:
        raise ValueError(f"limit copy: expected {reads} tensors to read, got {len(pool)}")
    a, b, c = (list(pool) + [None, None])[:3]
    new = extension.empty_like  # the outputs allocated as the kernels' are (huge pages advised when large)
    kernels = {
        (1, 1): lambda: new(a).copy_(a),
        (2, 1): lambda: torch.add(a, b, out=new(a)),
        (3, 1): lambda: torch.addcmul(a, b, c, out=new(a)),
        (2, 2): lambda: (new(a).copy_(a), new(b).copy_(b)),
    }
    if (reads, writes) not in kernels:
        raise ValueError(f"limit copy: no copy kernel for {reads}R {writes}W")
    return kernels[(reads, writes)]


# --------------------------------------------------------------------------
# Setup: the tensors of one case and what each provider runs on them
# --------------------------------------------------------------------------

def _as_tuple(out) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


@dataclasses.dataclass
class Setup:
    """The tensors of one case and a forward per provider.

    ``torch_forward(*args)`` is the torch eager function (``compile`` compiles it);
    ``normlab_forward(*args)`` is its ``normlab.functional`` twin. ``args_for(provider)``
    gives the arguments (the same tensors for every provider, except BatchNorm's
    running statistics, which each provider updates in its own copy).
    """

    case: Case
    torch_forward: Callable[..., Any]
    normlab_forward: Callable[..., Any] | None
    args_for: Callable[[str], tuple]
    grad_inputs: tuple[torch.Tensor, ...]   # what the backward differentiates with respect to
    grad_outputs: tuple[torch.Tensor, ...]  # dy (and dh for add_*)
    fwd_pool: tuple[torch.Tensor, ...]      # x-sized tensors the forward reads
    bwd_pool: tuple[torch.Tensor, ...]      # x-sized tensors the backward reads
    providers: Sequence[str] = PROVIDERS
    compile_backend: str = "inductor"
    unavailable: dict[str, str] = dataclasses.field(default_factory=dict)
    _compiled: Callable | None = None

    def __post_init__(self):
        for backend in ("cpu", "ref"):
            p = f"normlab-{backend}"
            if p in self.providers:
                why = normlab_unavailable(self.case.op, backend, self.fwd_pool[0])
                if why:
                    self.unavailable[p] = why

    def min_bytes(self, mode: str) -> int:
        return min_bytes(self.case.op, mode, self.case.shape, self.case.torch_dtype)

    def limit(self, mode: str) -> Callable[[], Any]:
        """The copy that moves ``mode``'s minimal bytes."""
        fwd = _copy_kernel(*traffic(self.case.op, "forward"), self.fwd_pool)
        bwd = _copy_kernel(*traffic(self.case.op, "backward"), self.bwd_pool)
        if mode == "forward":
            return fwd
        if mode == "backward":
            return bwd

        def both():
            fwd()
            return bwd()
        return both

    def forward_fn(self, provider: str) -> Callable[[], Any]:
        """The zero-argument forward of ``provider`` on this case's tensors."""
        args = self.args_for(provider)
        if provider == "torch":
            f = self.torch_forward
        elif provider == "compile":
            if self._compiled is None:
                self._compiled = torch.compile(self.torch_forward, dynamic=False,
                                               backend=self.compile_backend)
            f = self._compiled
        elif provider in ("normlab-cpu", "normlab-ref"):
            f = self.normlab_forward
        else:
            raise ValueError(f"normlab bench: unknown provider {provider!r}; expected one of {PROVIDERS}")
        return lambda: f(*args)

    def candidate(self, provider: str, mode: str) -> Candidate:
        """What to time for ``provider`` in ``mode`` (the provider must be available)."""
        if provider == "limit":
            call = self.limit(mode)
            return Candidate(lambda: call, torch.no_grad)
        backend = provider.split("-", 1)[1] if provider.startswith("normlab-") else None
        fwd = self.forward_fn(provider)
        inputs, grads = self.grad_inputs, self.grad_outputs

        @contextlib.contextmanager
        def context():
            with contextlib.ExitStack() as stack:
                if backend is not None:
                    stack.enter_context(use_backend(backend))
                if mode == "forward":
                    stack.enter_context(torch.no_grad())
                yield

        if mode == "forward":
            return Candidate(lambda: fwd, context)
        if mode == "backward":
            def prepare():
                outs = _as_tuple(fwd())  # untimed forward, its graph kept for the repeats

                def backward():
                    return torch.autograd.grad(outs, inputs, grads, retain_graph=True)
                return backward
            return Candidate(prepare, context)
        if mode == "forward+backward":
            def step():
                return torch.autograd.grad(_as_tuple(fwd()), inputs, grads)
            return Candidate(lambda: step, context)
        raise ValueError(f"normlab bench: unknown mode {mode!r}; expected one of {MODES}")


def _randn(shape, dtype, gen, layout="contiguous", requires_grad=False) -> torch.Tensor:
    t = torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
    if layout == "channels_last":
        t = t.contiguous(memory_format=torch.channels_last)
    return t.requires_grad_(requires_grad)


def _param(n, dtype, gen, offset) -> torch.Tensor:
    # parameters in the input's dtype, as in a module converted with .to(dtype)
    return (offset + 0.1 * torch.randn(n, generator=gen)).to(dtype).requires_grad_(True)


# --------------------------------------------------------------------------
# One setup factory per op
# --------------------------------------------------------------------------

def _torch_layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, EPS)


def _normlab_layer_norm(x, w, b):
    return NF.layer_norm(x, (x.shape[-1],), w, b, EPS)


def _torch_rms_norm(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, RMS_EPS)


def _normlab_rms_norm(x, w):
    return NF.rms_norm(x, (x.shape[-1],), w, RMS_EPS)


def _torch_add_layer_norm(x, r, w, b):
    h = torch.add(x, r)
    return F.layer_norm(h, (h.shape[-1],), w, b, EPS), h


def _normlab_add_layer_norm(x, r, w, b):
    return NF.add_layer_norm(x, r, (x.shape[-1],), w, b, EPS)


def _torch_add_rms_norm(x, r, w):
    h = torch.add(x, r)
    return F.rms_norm(h, (h.shape[-1],), w, RMS_EPS), h


def _normlab_add_rms_norm(x, r, w):
    return NF.add_rms_norm(x, r, (x.shape[-1],), w, RMS_EPS)


def _torch_batch_norm_train(x, w, b, rm, rv):
    return F.batch_norm(x, rm, rv, w, b, True, MOMENTUM, EPS)


def _normlab_batch_norm_train(x, w, b, rm, rv):
    return NF.batch_norm(x, rm, rv, w, b, True, MOMENTUM, EPS)


def _torch_batch_norm_eval(x, w, b, rm, rv):
    return F.batch_norm(x, rm, rv, w, b, False, MOMENTUM, EPS)


def _normlab_batch_norm_eval(x, w, b, rm, rv):
    return NF.batch_norm(x, rm, rv, w, b, False, MOMENTUM, EPS)


def _torch_group_norm(x, w, b):
    return F.group_norm(x, num_groups(x.shape[1]), w, b, EPS)


def _normlab_group_norm(x, w, b):
    return NF.group_norm(x, num_groups(x.shape[1]), w, b, EPS)


def _torch_layer_norm2d(x, w, b):
    """torch's usual channels-first LayerNorm: channels last, ``layer_norm``, channels back (views)."""
    return F.layer_norm(x.movedim(1, -1), (x.shape[1],), w, b, LN2D_EPS).movedim(-1, 1)


def _normlab_layer_norm2d(x, w, b):
    return NF.layer_norm2d(x, w, b, LN2D_EPS)


def _normlab_or_none(op: str, fn: Callable) -> Callable | None:
    return fn if _normlab_fn(_NORMLAB_NAME[op]) is not None else None


def setup_row_norm(case: Case, providers: Sequence[str] = PROVIDERS, generator=None,
                   compile_backend: str = "inductor") -> Setup:
    """layer_norm, rms_norm, add_layer_norm, add_rms_norm over the last dim of a 2-D ``x``."""
    gen = generator or torch.Generator().manual_seed(0)
    dt, n = case.torch_dtype, case.shape[-1]
    x = _randn(case.shape, dt, gen, requires_grad=True)
    w = _param(n, dt, gen, 1.0)
    rms = case.op in ("rms_norm", "add_rms_norm")
    add = case.op.startswith("add_")
    b = None if rms else _param(n, dt, gen, 0.0)
    r = _randn(case.shape, dt, gen, requires_grad=True) if add else None
    dy = _randn(case.shape, dt, gen)
    dh = _randn(case.shape, dt, gen) if add else None
    args = tuple(t for t in (x, r, w, b) if t is not None)
    torch_fn, normlab_fn = {
        "layer_norm": (_torch_layer_norm, _normlab_layer_norm),
        "rms_norm": (_torch_rms_norm, _normlab_rms_norm),
        "add_layer_norm": (_torch_add_layer_norm, _normlab_add_layer_norm),
        "add_rms_norm": (_torch_add_rms_norm, _normlab_add_rms_norm),
    }[case.op]
    return Setup(
        case, torch_fn, _normlab_or_none(case.op, normlab_fn), lambda provider: args,
        grad_inputs=args, grad_outputs=(dy, dh) if add else (dy,),
        fwd_pool=(x, r) if add else (x,), bwd_pool=(x, dy, dh) if add else (x, dy),
        providers=providers, compile_backend=compile_backend,
    )


def _channel_inputs(case: Case, gen: torch.Generator):
    """``(x, w, b, dy)`` for a per-channel op on ``case`` (dim 1 the channels; x and dy in its layout)."""
    dt, c = case.torch_dtype, case.shape[1]
    x = _randn(case.shape, dt, gen, case.layout, requires_grad=True)
    w, b = _param(c, dt, gen, 1.0), _param(c, dt, gen, 0.0)
    dy = _randn(case.shape, dt, gen, case.layout)
    return x, w, b, dy


def setup_batch_norm(case: Case, providers: Sequence[str] = PROVIDERS, generator=None,
                     compile_backend: str = "inductor") -> Setup:
    """batch_norm_train / batch_norm_eval on ``(N, C)`` or ``(N, C, H, W)``, either layout."""
    gen = generator or torch.Generator().manual_seed(0)
    dt, c = case.torch_dtype, case.shape[1]
    x, w, b, dy = _channel_inputs(case, gen)
    # parameters and running statistics in x's dtype, as after model.to(dtype)
    rm0 = (0.1 * torch.randn(c, generator=gen)).to(dt)
    rv0 = (1.0 + 0.1 * torch.rand(c, generator=gen)).to(dt)
    stats = {}

    def args_for(provider):  # each provider updates its own running statistics
        if provider not in stats:
            stats[provider] = (rm0.clone(), rv0.clone())
        return (x, w, b, *stats[provider])

    train = case.op == "batch_norm_train"
    torch_fn = _torch_batch_norm_train if train else _torch_batch_norm_eval
    normlab_fn = _normlab_batch_norm_train if train else _normlab_batch_norm_eval
    return Setup(
        case, torch_fn, _normlab_or_none(case.op, normlab_fn), args_for,
        grad_inputs=(x, w, b), grad_outputs=(dy,), fwd_pool=(x,), bwd_pool=(x, dy),
        providers=providers, compile_backend=compile_backend,
    )


def _setup_affine_channels(torch_fn, normlab_fn, doc: str):
    """The setup factory of a per-channel op ``f(x, w, b)`` without running statistics."""

    def setup(case: Case, providers: Sequence[str] = PROVIDERS, generator=None,
              compile_backend: str = "inductor") -> Setup:
        x, w, b, dy = _channel_inputs(case, generator or torch.Generator().manual_seed(0))
        args = (x, w, b)
        return Setup(
            case, torch_fn, _normlab_or_none(case.op, normlab_fn), lambda p: args,
            grad_inputs=args, grad_outputs=(dy,), fwd_pool=(x,), bwd_pool=(x, dy),
            providers=providers, compile_backend=compile_backend,
        )

    setup.__doc__ = doc
    return setup


setup_group_norm = _setup_affine_channels(
    _torch_group_norm, _normlab_group_norm,
    "group_norm on ``(N, C, *)`` with ``num_groups(C)`` groups (32 for the default shapes).")
setup_layer_norm2d = _setup_affine_channels(
    _torch_layer_norm2d, _normlab_layer_norm2d,
    "layer_norm2d over dim 1 of ``(N, C, *)``, either layout, against torch's permute -> "
    "``layer_norm`` -> permute.")


#: op -> setup factory
SETUPS: dict[str, Callable[..., Setup]] = {
    "layer_norm": setup_row_norm,
    "rms_norm": setup_row_norm,
    "add_layer_norm": setup_row_norm,
    "add_rms_norm": setup_row_norm,
    "batch_norm_train": setup_batch_norm,
    "batch_norm_eval": setup_batch_norm,
    "group_norm": setup_group_norm,
    "layer_norm2d": setup_layer_norm2d,
}


def make_setup(case: Case, providers: Sequence[str] = PROVIDERS, compile_backend: str = "inductor",
               seed: int = 0) -> Setup:
    """Build the tensors of ``case`` (seeded) and its per-provider forwards."""
    return SETUPS[case.op](case, providers=providers,
                           generator=torch.Generator().manual_seed(seed),
                           compile_backend=compile_backend)
