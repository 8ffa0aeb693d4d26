"""What ``normlab bench`` measures: the cases, one setup factory per op, and the byte accounting.

A *case* is one op on one input: ``(op, shape, dtype, layout)``. Its setup
factory builds the tensors once and returns, for every provider, a zero-argument
forward on those same tensors, plus the "limit" copies and the op's minimal
memory traffic. :meth:`Setup.candidate` turns a (provider, mode) pair into what
the timer runs.

Providers
---------

- ``normlab-cpu``: ``normlab.functional`` under ``use_backend("cpu")`` (the fused kernels).
- ``normlab-ref``: ``normlab.functional`` under ``use_backend("ref")`` (the reference formula).
- ``torch``: torch eager, ``torch.nn.functional`` (for ``add_*``: ``torch.add`` then the norm).
- ``compile``: ``torch.compile(<the torch eager function>, dynamic=False)``, compiled
  once per case (shape, dtype, layout, thread count); its compile time shows up as
  the first-call time, never in the median.
- ``limit``: a plain copy that moves the op's minimal bytes with the same allocation
  pattern (see ``MIN_TRAFFIC`` and ``_copy_kernel``).

A provider that does not exist yet (backend ``"cpu"`` not registered or not
implementing the op or dtype, a ``normlab.functional`` function missing,
``NotImplementedError``) is *n/a* with a reason, never a crash; any other
exception makes the provider's row an *error* with its message, and the run goes on.

Modes
-----

- ``forward``: the forward under ``torch.no_grad()`` (inference; no autograd graph).
- ``backward``: the forward runs once, untimed; then ``torch.autograd.grad(outputs,
  inputs, grads, retain_graph=True)`` is timed. Inputs are ``x`` (and ``residual``)
  and the affine parameters, so the backward writes ``dx`` and ``dw``/``db``.
  ``torch.autograd.grad`` returns fresh tensors: nothing accumulates into ``.grad``.
- ``forward+backward``: both, as one training step of the layer.

Minimal bytes (the limit)
-------------------------

Counted in units of one tensor of ``x``'s size and dtype (``x.numel() *
x.element_size()`` bytes). Per-row/per-channel statistics and the parameters are
``O(rows)`` or ``O(C)`` and left out: below 2 % of the traffic for every default
shape except the 4x6 call-overhead one.

===================  =========  =========  ================
op                   forward    backward   forward+backward
===================  =========  =========  ================
layer_norm           1R 1W      2R 1W      3R 2W
rms_norm             1R 1W      2R 1W      3R 2W
add_layer_norm       2R 2W      3R 1W      5R 3W
add_rms_norm         2R 2W      3R 1W      5R 3W
batch_norm_train     1R 1W      2R 1W      3R 2W
batch_norm_eval      1R 1W      2R 1W      3R 2W
group_norm           1R 1W      2R 1W      3R 2W
===================  =========  =========  ================

- A norm's forward reads ``x`` and writes ``y``. Its backward reads ``x`` (to rebuild
  ``x_hat`` from the saved mean/rstd) and ``dy`` and writes ``dx``.
- BatchNorm in eval mode needs ``x`` in the backward too, because ``dw = sum(dy *
  x_hat)`` and the weight requires grad here (fine-tuning with frozen statistics).
- ``add_*`` forward reads ``x`` and ``residual`` and writes ``y`` and ``h = x +
  residual``. Both outputs get a gradient (in a pre-norm transformer ``h`` is the
  residual stream that continues), so the backward reads the saved ``h``, ``dy`` and
  ``dh`` and writes one tensor: ``dx`` and ``dresidual`` are both ``dh + dLN/dh``, the
  same values, which need not be written twice.
- ``forward+backward`` is the sum: the backward cannot start before ``dy`` exists, so
  at DRAM sizes nothing read by the forward is still in cache.
- The counts are lower bounds, not what a real kernel must move: BatchNorm in
  training mode and GroupNorm with large groups need a second read of ``x`` (statistics
  first, then normalise) once a channel/group no longer fits in cache, so their
  fraction of the limit stays below 1 at DRAM sizes by design.

The limit copies: (1R 1W) ``a.clone()``; (2R 1W) ``torch.add(a, b)``; (3R 1W)
``torch.addcmul(a, b, c)``; (2R 2W) ``(a.clone(), b.clone())`` -- two outputs, as the
``add_*`` forward allocates ``y`` and ``h`` (``torch.add(x, r)`` plus ``x.clone()``
would move 3R 2W). ``forward+backward`` runs the forward copy, then the backward
copy. Copies run under ``no_grad`` and keep ``x``'s memory format.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.nn.functional as F

import normlab
import normlab.functional as NF

OPS = (
    "layer_norm",
    "rms_norm",
    "add_layer_norm",
    "add_rms_norm",
    "batch_norm_train",
    "batch_norm_eval",
    "group_norm",
)
#: names that ``--ops`` accepts besides OPS, expanding to several ops
OP_ALIASES = {"batch_norm": ("batch_norm_train", "batch_norm_eval")}
MODES = ("forward", "backward", "forward+backward")
PROVIDERS = ("normlab-cpu", "normlab-ref", "torch", "compile", "limit")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

# Minimal memory traffic in units of one x-sized tensor: mode -> (reads, writes).
# forward+backward is the sum of the two (see the module docstring for the why).
MIN_TRAFFIC: dict[str, dict[str, tuple[int, int]]] = {
    #  op                   forward          backward
    "layer_norm":       {"forward": (1, 1), "backward": (2, 1)},  # x -> y;      x, dy -> dx
    "rms_norm":         {"forward": (1, 1), "backward": (2, 1)},  # x -> y;      x, dy -> dx
    "add_layer_norm":   {"forward": (2, 2), "backward": (3, 1)},  # x, r -> y, h; h, dy, dh -> dx
    "add_rms_norm":     {"forward": (2, 2), "backward": (3, 1)},  # x, r -> y, h; h, dy, dh -> dx
    "batch_norm_train": {"forward": (1, 1), "backward": (2, 1)},  # x -> y;      x, dy -> dx
    "batch_norm_eval":  {"forward": (1, 1), "backward": (2, 1)},  # x -> y;      x, dy -> dx (dw needs x)
    "group_norm":       {"forward": (1, 1), "backward": (2, 1)},  # x -> y;      x, dy -> dx
}

EPS = 1e-5
RMS_EPS = 1e-6  # explicit: torch's eps=None is finfo(input dtype), normlab's finfo(float32)
MOMENTUM = 0.1

# Default shapes. Row ops (layer/rms norm and their add_ variants) normalise the last dim.
# Sizes run from a 4x6 tensor (call overhead) to 256 MB of float32 (DRAM).
ROW_SHAPES = (
    (4, 6),
    (256, 1024),      # 1 MB fp32: in cache
    (4096, 1024),     # 16 MB   issue target
    (65536, 256),     # 64 MB   issue target
    (8192, 4096),     # 128 MB  issue target
    (32768, 1024),    # 128 MB  issue target
    (65536, 1024),    # 256 MB
)
BATCH_NORM_SHAPES = (
    (4, 6),                # (N, C)
    (4096, 1024),
    (65536, 1024),         # 256 MB
    (1, 6, 2, 2),          # NCHW, 24 values: call overhead
    (32, 64, 32, 32),      # 8 MB    issue target
    (256, 256, 8, 8),      # 16 MB   issue target
    (256, 256, 32, 32),    # 256 MB
)
GROUP_NORM_SHAPES = (
    (1, 6, 2, 2),
    (32, 64, 32, 32),
    (256, 256, 8, 8),
    (256, 256, 32, 32),
)
# --quick: one mid-size (cache-exceeding on most machines) shape per family
QUICK_ROW_SHAPES = ((4096, 1024),)
QUICK_NCHW_SHAPES = ((32, 64, 32, 32),)


def traffic(op: str, mode: str) -> tuple[int, int]:
    """``(reads, writes)`` of x-sized tensors that ``op`` in ``mode`` must move at least."""
    table = MIN_TRAFFIC[op]
    if mode == "forward+backward":
        (rf, wf), (rb, wb) = table["forward"], table["backward"]
        return rf + rb, wf + wb
    return table[mode]


def min_bytes(op: str, mode: str, shape: Sequence[int], dtype: torch.dtype | str) -> int:
    """Minimal bytes moved by ``op`` in ``mode`` on an input of ``shape``/``dtype``."""
    if isinstance(dtype, str):
        dtype = DTYPES[dtype]
    reads, writes = traffic(op, mode)
    return (reads + writes) * math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def num_groups(c: int) -> int:
    """GroupNorm's group count for ``c`` channels: 32 when it divides, else the largest divisor."""
    return math.gcd(c, 32)


def shape_str(shape: Sequence[int]) -> str:
    return "x".join(map(str, shape))


def parse_shape(text: str) -> tuple[int, ...]:
    """``"4096x1024"`` -> ``(4096, 1024)``."""
    try:
        shape = tuple(int(p) for p in text.lower().replace("*", "x").split("x"))
    except ValueError:
        raise ValueError(f"normlab bench: expected a shape like 4096x1024, got {text!r}") from None
    if len(shape) < 2 or min(shape) <= 0:
        raise ValueError(f"normlab bench: expected a shape of >= 2 positive dims like 4x6, got {text!r}")
    return shape


@dataclasses.dataclass(frozen=True)
class Case:
    """One op on one input. ``layout`` is ``"contiguous"`` or ``"channels_last"`` (4-D only)."""

    op: str
    shape: tuple[int, ...]
    dtype: str
    layout: str = "contiguous"

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def x_bytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.torch_dtype).element_size()

    def label(self) -> str:
        lay = "" if self.layout == "contiguous" else f" {self.layout}"
        return f"{self.op} {shape_str(self.shape)}{lay} {self.dtype}"


def _family(op: str) -> str:
    if op in ("batch_norm_train", "batch_norm_eval"):
        return "batch_norm"
    return "group_norm" if op == "group_norm" else "rows"


def cases_for(op: str, dtype: str, shapes: Sequence[Sequence[int]] | None = None,
              quick: bool = False) -> list[Case]:
    """The cases of ``op`` in ``dtype``: the default shapes (or ``shapes``), each 4-D
    BatchNorm shape in both layouts. Given ``shapes`` are kept where they fit the op:
    2-D for every op, 3-D and more for BatchNorm/GroupNorm only."""
    family = _family(op)
    if shapes is None:
        if quick:
            shapes = QUICK_ROW_SHAPES if family == "rows" else QUICK_NCHW_SHAPES
        else:
            shapes = {"rows": ROW_SHAPES, "batch_norm": BATCH_NORM_SHAPES,
                      "group_norm": GROUP_NORM_SHAPES}[family]
    out = []
    for shape in shapes:
        shape = tuple(int(s) for s in shape)
        if family == "rows" and len(shape) != 2:
            continue
        out.append(Case(op, shape, dtype))
        if family == "batch_norm" and len(shape) == 4:
            out.append(Case(op, shape, dtype, "channels_last"))
    return out


# --------------------------------------------------------------------------
# Providers that may not exist yet
# --------------------------------------------------------------------------

def _normlab_fn(name: str) -> Callable | None:
    return getattr(NF, name, None)


_NORMLAB_NAME = {
    "layer_norm": "layer_norm", "rms_norm": "rms_norm",
    "add_layer_norm": "add_layer_norm", "add_rms_norm": "add_rms_norm",
    "batch_norm_train": "batch_norm", "batch_norm_eval": "batch_norm", "group_norm": "group_norm",
}


def exception_status(e: BaseException) -> tuple[str, str]:
    """``("n/a", why)`` for a ``NotImplementedError``, else ``("error", why)``."""
    msg = f"{type(e).__name__}: {e}".splitlines()[0][:200]
    return ("n/a" if isinstance(e, NotImplementedError) else "error"), msg


def normlab_unavailable(op: str, backend: str, x: torch.Tensor | None = None) -> str | None:
    """Why ``normlab-<backend>`` cannot run ``op`` (on ``x``); ``None`` when it can.

    Asks the backend registry itself (``normlab.backend_for`` under
    ``use_backend``), which knows the ops each backend implements and the tensors
    it serves; so an op without a ``"cpu"`` kernel is n/a instead of being timed
    under the wrong name.
    """
    if backend not in normlab.available_backends():
        return f"backend {backend!r} not registered (available: {normlab.available_backends()})"
    name = _NORMLAB_NAME[op]
    if _normlab_fn(name) is None:
        return f"normlab.functional.{name} does not exist yet"
    if x is not None:
        try:
            with normlab.use_backend(backend):
                normlab.backend_for(x, name)
        except RuntimeError as e:
            return str(e).splitlines()[0][:200]
    return None


# --------------------------------------------------------------------------
# The limit: copies that move the minimal bytes
# --------------------------------------------------------------------------

def _copy_kernel(reads: int, writes: int, pool: Sequence[torch.Tensor]) -> Callable[[], Any]:
    """A plain copy reading ``reads`` and writing ``writes`` tensors of ``pool[0]``'s size."""
    if len(pool) < reads:
        raise ValueError(f"limit copy: expected {reads} tensors to read, got {len(pool)}")
    a, b, c = (list(pool) + [None, None])[:3]
    kernels = {
        (1, 1): lambda: a.clone(),
        (2, 1): lambda: torch.add(a, b),
        (3, 1): lambda: torch.addcmul(a, b, c),
        (2, 2): lambda: (a.clone(), b.clone()),
    }
    if (reads, writes) not in kernels:
        raise ValueError(f"limit copy: no copy kernel for {reads}R {writes}W")
    return kernels[(reads, writes)]


# --------------------------------------------------------------------------
# Setup: the tensors of one case and what each provider runs on them
# --------------------------------------------------------------------------

@dataclasses.dataclass
class Candidate:
    """What the timer runs for one (provider, mode): ``prepare()`` returns the callable
    to time (the backward mode's untimed forward happens inside it); every call of
    ``prepare`` and of the callable runs inside ``context()``."""

    prepare: Callable[[], Callable[[], Any]]
    context: Callable[[], AbstractContextManager] = contextlib.nullcontext


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
                    stack.enter_context(normlab.use_backend(backend))
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


def setup_group_norm(case: Case, providers: Sequence[str] = PROVIDERS, generator=None,
                     compile_backend: str = "inductor") -> Setup:
    """group_norm on ``(N, C, *)`` with ``num_groups(C)`` groups (32 for the default shapes)."""
    x, w, b, dy = _channel_inputs(case, generator or torch.Generator().manual_seed(0))
    args = (x, w, b)
    return Setup(
        case, _torch_group_norm, _normlab_or_none(case.op, _normlab_group_norm), lambda p: args,
        grad_inputs=args, grad_outputs=(dy,), fwd_pool=(x,), bwd_pool=(x, dy),
        providers=providers, compile_backend=compile_backend,
    )


#: op -> setup factory
SETUPS: dict[str, Callable[..., Setup]] = {
    "layer_norm": setup_row_norm,
    "rms_norm": setup_row_norm,
    "add_layer_norm": setup_row_norm,
    "add_rms_norm": setup_row_norm,
    "batch_norm_train": setup_batch_norm,
    "batch_norm_eval": setup_batch_norm,
    "group_norm": setup_group_norm,
}


def make_setup(case: Case, providers: Sequence[str] = PROVIDERS, compile_backend: str = "inductor",
               seed: int = 0) -> Setup:
    """Build the tensors of ``case`` (seeded) and its per-provider forwards."""
    return SETUPS[case.op](case, providers=providers,
                           generator=torch.Generator().manual_seed(seed),
                           compile_backend=compile_backend)
