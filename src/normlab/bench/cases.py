"""What ``normlab bench`` measures: the cases, the providers, and the byte accounting.

A *case* is one op on one input: ``(op, shape, dtype, layout)``. Its setup
factory (:mod:`normlab.bench.setups`) builds the tensors once and returns, for
every provider, a zero-argument forward on those same tensors, plus the "limit"
copies and the op's minimal memory traffic. ``Setup.candidate`` turns a
(provider, mode) pair into what the timer runs (a :class:`Candidate`).

Providers
---------

- ``normlab-cpu``: ``normlab.functional`` under ``use_backend("cpu")`` (the fused kernels).
- ``normlab-ref``: ``normlab.functional`` under ``use_backend("ref")`` (the reference formula).
- ``torch``: torch eager, ``torch.nn.functional`` (for ``add_*``: ``torch.add`` then the norm).
- ``compile``: ``torch.compile(<the torch eager function>, dynamic=False)``, compiled
  once per case (shape, dtype, layout, thread count); its compile time shows up as
  the first-call time, never in the median.
- ``limit``: a plain copy that moves the op's minimal bytes with the same allocation
  pattern (see ``MIN_TRAFFIC`` and ``setups._copy_kernel``).

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
layer_norm2d         1R 1W      2R 1W      3R 2W
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
``torch.addcmul(a, b, c)``; (2R 2W) ``(a.clone(), b.clone())``, each writing into an
output allocated as normlab's kernels allocate theirs (``ops/extension.empty_like``: huge
pages advised from 4 MiB, which cuts the page faults of a fresh buffer) -- two outputs, as the
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

from normlab._backend import available_backends, backend_for, use_backend
import normlab.functional as NF

OPS = (
    "layer_norm",
    "rms_norm",
    "add_layer_norm",
    "add_rms_norm",
    "batch_norm_train",
    "batch_norm_eval",
    "group_norm",
    "layer_norm2d",
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
    "layer_norm2d":     {"forward": (1, 1), "backward": (2, 1)},  # x -> y;      x, dy -> dx
}

EPS = 1e-5
LN2D_EPS = 1e-6  # LayerNorm2d's default (timm, detectron2, SAM)
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
# LayerNorm2d (N, C, H, W), each in both layouts: call overhead, the chapters' block size
# (2 MB: in cache), and 64 MB of float32 with few and with many channels (DRAM)
LAYER_NORM2D_SHAPES = (
    (1, 6, 2, 2),
    (8, 64, 32, 32),
    (16, 64, 128, 128),
    (15, 768, 37, 37),
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
    return op if op in ("group_norm", "layer_norm2d") else "rows"


def cases_for(op: str, dtype: str, shapes: Sequence[Sequence[int]] | None = None,
              quick: bool = False) -> list[Case]:
    """The cases of ``op`` in ``dtype``: the default shapes (or ``shapes``), each 4-D
    BatchNorm and LayerNorm2d shape in both layouts. Given ``shapes`` are kept where they
    fit the op: 2-D for every op but LayerNorm2d, 3-D and more for BatchNorm/GroupNorm/
    LayerNorm2d only."""
    family = _family(op)
    if shapes is None:
        if quick:
            shapes = QUICK_ROW_SHAPES if family == "rows" else QUICK_NCHW_SHAPES
        else:
            shapes = {"rows": ROW_SHAPES, "batch_norm": BATCH_NORM_SHAPES,
                      "group_norm": GROUP_NORM_SHAPES, "layer_norm2d": LAYER_NORM2D_SHAPES}[family]
    out = []
    for shape in shapes:
        shape = tuple(int(s) for s in shape)
        if (family == "rows" and len(shape) != 2) or (family == "layer_norm2d" and len(shape) < 3):
            continue
        out.append(Case(op, shape, dtype))
        if family in ("batch_norm", "layer_norm2d") and len(shape) == 4:
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
    "layer_norm2d": "layer_norm2d",
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
    if backend not in available_backends():
        return f"backend {backend!r} not registered (available: {available_backends()})"
    name = _NORMLAB_NAME[op]
    if _normlab_fn(name) is None:
        return f"normlab.functional.{name} does not exist yet"
    if x is not None:
        try:
            with use_backend(backend):
                backend_for(x, name)
        except RuntimeError as e:
            return str(e).splitlines()[0][:200]
    return None


# --------------------------------------------------------------------------
# What the timer runs
# --------------------------------------------------------------------------

@dataclasses.dataclass
class Candidate:
    """What the timer runs for one (provider, mode): ``prepare()`` returns the callable
    to time (the backward mode's untimed forward happens inside it); every call of
    ``prepare`` and of the callable runs inside ``context()``."""

    prepare: Callable[[], Callable[[], Any]]
    context: Callable[[], AbstractContextManager] = contextlib.nullcontext
