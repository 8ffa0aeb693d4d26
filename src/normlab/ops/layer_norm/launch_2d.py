"""LayerNorm2d on contiguous (NCHW) inputs: the launchers of ``kernels_2d.py``, its custom ops,
its ``autograd.Function`` and the entry point :func:`layer_norm2d_nchw`.

Layering as in ``op.py`` (kernel -> launcher -> custom op / eager Function -> entry point):

- :func:`_forward2d` / :func:`_backward2d`: allocate the outputs, pass every tensor by
  address (``ops/_ptr.py``; bfloat16/float16 as their bits) and run the kernel in the
  version that fits the size (``ops/_launch.use_parallel``).
- declared to ``ops/_register``: the custom ops ``normlab::layer_norm2d_fwd`` (with its
  autograd formula) and ``normlab::layer_norm2d_bwd``, with fakes, so
  ``torch.compile(fullgraph=True)`` traces each as one node; the eager twin
  ``LayerNorm2dEager``; :func:`layer_norm2d`, the backend table's ``"cpu"`` entry.

The forward saves ``x`` and the per-pixel ``mean`` and ``rstd``; the backward recomputes
``x_hat``. Under ``create_graph=True`` (double backward) the backward runs LayerNorm's
reference backward in differentiable torch ops on the pixels as rows. Under torch.func
transforms ``normlab.functional.layer_norm2d`` takes LayerNorm's row path instead (whose
transform rules exist).

(No ``from __future__ import annotations``: ``torch.library`` reads the type hints.)
"""

import functools
import importlib
from typing import Optional

import torch
from torch import Tensor

from .. import _launch, _register, _transforms
from .._common import acc_dtype, to_acc
from .._launch import PROTO as _PROTO
from .._launch import _SerialKernels
from .._launch import call as _call
from .._launch import param_ptr as _param_ptr
from . import op as _row_op
from .reference import layer_norm2d_rows, layer_norm_backward_ref, layer_norm_stats

_module = None
_serial = None


def _k(numel: int):
    """``kernels_2d`` (imported, numba and all, on first use) in the version that fits ``numel``."""
    global _module, _serial
    if _module is None:
        _module = importlib.import_module(__package__ + ".kernels_2d")
        _serial = _SerialKernels(_module)
    return _module if _launch.use_parallel(numel) else _serial


# A task covers a block of pixels of one sample, all C channels: about BLOCK_BYTES (256 KiB,
# so the block's planes stay in L2 through the kernels' passes; measured against 8192, 16384
# and 131072 float32 values on (8, C, H, W) for C from 64 to 2048, 1 thread: larger blocks pay
# the per-plane loop overhead less often -- (8, 384, 14, 14) forward+backward 4.3 -> 1.4 ms
# against 8192 values -- and 65536 was within noise of the best). Counted in bytes, not
# values, and with each plane's run at least RUN_BYTES (1 KiB) while the block stays within
# MAX_BYTES (1 MiB): a block's planes are C short streams from memory, and runs of a few
# cache lines each (80 float32 pixels at C = 768) leave the hardware prefetcher no time to
# start. Measured side by side, one thread, forward+backward, the same kernels with the old
# rule's block (65536 values) and this one's: float32 (16, 384, 52, 52) 82.7 -> 71.8 ms,
# (15, 768, 37, 37) 85.2 -> 65.6 ms, (4, 2048, 32, 32) 65.1 -> 47.3 ms; bfloat16 (15, 192, 74, 74)
# 43.2 -> 29.4 ms, (16, 384, 52, 52) 52.4 -> 31.3 ms, (8, 256, 64, 64) 28.1 -> 20.7 ms; smaller
# shapes 1.03-1.10x; one within noise (bfloat16 (2, 3000, 32, 32) 28.6 -> 30.1 ms). At least
# MIN_BLOCK pixels (short vector loops over many planes cost more than they move), a multiple
# of VEC; halved (not below MIN_BLOCK) while there are fewer than MIN_TASKS tasks.
BLOCK_BYTES = 256 << 10
RUN_BYTES = 1 << 10
MAX_BYTES = 1 << 20
MIN_BLOCK = 64
VEC = 16  # pixels in one 512-bit vector of float32
MIN_TASKS = 16


@functools.lru_cache(maxsize=1024)
def block_size(n: int, nc: int, ns: int, itemsize: int) -> int:
    """Pixels per task for N = ``n`` samples, C = ``nc`` channels, S = ``ns`` pixels and
    ``itemsize``-byte storage, from the shape and dtype only (dw/db are merged per task:
    their bits never depend on the number of threads)."""
    pixel = max(nc, 1) * itemsize  # bytes of one pixel's channels
    blk = max(BLOCK_BYTES // pixel, min(RUN_BYTES // itemsize, MAX_BYTES // pixel))
    blk = max(MIN_BLOCK, blk // VEC * VEC)
    while blk > MIN_BLOCK and n * -(-ns // blk) < MIN_TASKS:
        blk = max(MIN_BLOCK, blk // 2 // VEC * VEC)
    return max(1, min(blk, ns))


# Tensors of at least this many bytes are read with prefetches (the kernels' ``far``): their
# first pass over a block's planes streams from memory, and asking for the runs a few planes
# ahead keeps more of them in flight. Side by side, one thread, medians of 9: forward float32
# (32, 96, 64, 64) 27.2 -> 26.7 ms, (16, 64, 128, 128) 39.9 -> 37.2, (15, 768, 37, 37) 39.8 ->
# 38.6; bfloat16 (16, 96, 64, 64) 5.28 -> 4.76, (32, 96, 64, 64) 11.5 -> 10.2, (15, 768, 37, 37)
# 19.0 -> 15.8; backward float32 (32, 96, 64, 64) 35.2 -> 32.5, (15, 768, 37, 37) 55.8 -> 51.6;
# bfloat16 (15, 768, 37, 37) 28.6 -> 24.2. On tensors that stay in cache they are only extra
# instructions (bfloat16 backward (8, 384, 14, 14) 0.82 -> 0.93 ms). They never change a result.
FAR_BYTES = 8 << 20


def _far(x: Tensor) -> bool:
    return x.numel() * x.element_size() >= FAR_BYTES


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _forward2d(x: Tensor, w: Optional[Tensor], b: Optional[Tensor], eps: float):
    """``(y, mean, rstd)`` for (N, C, *) ``x`` (non-empty); ``mean``/``rstd`` (N * S,) numpy arrays."""
    if not x.is_contiguous():
        x = x.contiguous()
    n, nc = x.shape[0], x.shape[1]
    ns = x.numel() // (n * nc)
    y = _launch.empty_like(x, memory_format=torch.contiguous_format)
    acc = _acc(x.dtype)
    pw, keep_w = _param_ptr(w, acc)
    pb, keep_b = _param_ptr(b, acc)
    proto, acc_proto = _PROTO[x.dtype]
    k = _k(x.numel())
    mean, rstd = _call(k.ln2d_fwd_at, x.dtype, proto, acc_proto, x.data_ptr(), pw, pb, y.data_ptr(),
                       n, nc, ns, float(eps), block_size(n, nc, ns, x.element_size()), _far(x))
    return y, mean, rstd


def _backward2d(dy: Tensor, x: Tensor, w: Optional[Tensor], mean, rstd, need_wb: bool):
    """``(dx, dw, db)``; dw/db in the accumulation dtype, (0,) unless ``need_wb``."""
    if not x.is_contiguous():
        x = x.contiguous()
    if dy.dtype != x.dtype:
        dy = dy.to(x.dtype)
    if not dy.is_contiguous():
        dy = dy.contiguous()
    if isinstance(mean, Tensor):  # the custom op's saved statistics
        mean, rstd = mean.contiguous().numpy(), rstd.contiguous().numpy()
    n, nc = x.shape[0], x.shape[1]
    ns = x.numel() // (n * nc)
    dx = _launch.empty_like(x, memory_format=torch.contiguous_format)
    acc = _acc(x.dtype)
    pw, keep_w = _param_ptr(w, acc)
    proto, acc_proto = _PROTO[x.dtype]
    k = _k(x.numel())
    dw, db = _call(k.ln2d_bwd_at, x.dtype, proto, acc_proto, dy.data_ptr(), x.data_ptr(), pw, mean, rstd,
                   dx.data_ptr(), n, nc, ns, block_size(n, nc, ns, x.element_size()), bool(need_wb), _far(x))
    return dx, torch.from_numpy(dw), torch.from_numpy(db)


def _grads(dy, x, w, b_dtype, mean, rstd, eps, need_dw, need_db, eager):
    """``(dx, dw, db)`` of LayerNorm2d; the differentiable reference backward under create_graph."""
    if dy is None:
        return None, None, None
    need_dw = need_dw and w is not None
    need_db = need_db and b_dtype is not None
    if _transforms.differentiable_backward():  # create_graph=True: torch ops on the pixels as rows
        nc = x.shape[1]
        rows = x.movedim(1, -1).reshape(-1, nc)  # (N * S, C)
        m, r = layer_norm_stats(to_acc(rows), eps)
        dxr, dw, db = layer_norm_backward_ref(dy.movedim(1, -1).reshape(-1, nc), rows, w, m, r, True,
                                              need_dw, need_db)
        dx = dxr.reshape(x.movedim(1, -1).shape).movedim(-1, 1)
    elif eager:
        dx, dw, db = _backward2d(dy, x, w, mean, rstd, need_dw or need_db)
    else:
        dx, dw, db = layer_norm2d_bwd(dy, x, w, mean, rstd, need_dw or need_db)
    dw = (dw if dw.dtype == w.dtype else dw.to(w.dtype)) if need_dw else None
    db = (db if db.dtype == b_dtype else db.to(b_dtype)) if need_db else None
    return dx, dw, db


# --------------------------------------------------------------------------
# Custom ops (torch.compile)
# --------------------------------------------------------------------------


def _stats_like(x: Tensor) -> Tensor:
    return x.new_empty((x.numel() // x.shape[1],), dtype=acc_dtype(x.dtype))


def _layer_norm2d_fwd(x: Tensor, w: Optional[Tensor], b: Optional[Tensor], eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """LayerNorm over dim 1 of contiguous (N, C, *) ``x``: ``(y, mean, rstd)``, per-pixel statistics."""
    y, mean, rstd = _forward2d(x, w, b, eps)
    return y, torch.from_numpy(mean), torch.from_numpy(rstd)


def _layer_norm2d_bwd(
    dy: Tensor, x: Tensor, w: Optional[Tensor], mean: Tensor, rstd: Tensor, need_wb: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """LayerNorm2d gradients ``(dx, dw, db)``; dw/db in the accumulation dtype, empty unless ``need_wb``."""
    return _backward2d(dy, x, w, mean, rstd, need_wb)


def _bwd_fake(dy, x, w, mean, rstd, need_wb):
    n = x.shape[1] if need_wb else 0
    acc = acc_dtype(x.dtype)
    return (torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty((n,), dtype=acc),
            x.new_empty((n,), dtype=acc))


def _setup(ctx, inputs, output):
    x, w, b, eps = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, w, mean, rstd)
    ctx.eps = eps
    ctx.b_dtype = b.dtype if b is not None else None
    ctx.mark_non_differentiable(mean, rstd)
    ctx.set_materialize_grads(False)


def _backward(ctx, dy, _dmean, _drstd):
    x, w, mean, rstd = ctx.saved_tensors
    dx, dw, db = _grads(dy, x, w, ctx.b_dtype, mean, rstd, ctx.eps, *ctx.needs_input_grad[1:3], eager=False)
    return dx, dw, db, None


layer_norm2d_bwd = _register.custom_op("layer_norm2d_bwd", _layer_norm2d_bwd, fake=_bwd_fake)
layer_norm2d_fwd = _register.custom_op(
    "layer_norm2d_fwd", _layer_norm2d_fwd,
    fake=lambda x, w, b, eps: (torch.empty_like(x, memory_format=torch.contiguous_format), _stats_like(x),
                               _stats_like(x)),
    backward=_backward, setup_context=_setup,
)


# --------------------------------------------------------------------------
# Eager path
# --------------------------------------------------------------------------


def _eager_forward(ctx, x, w, b, eps):
    y, mean, rstd = _forward2d(x, w, b, eps)
    ctx.save_for_backward(x, w)
    ctx.stats = mean, rstd  # numpy arrays: no tensor made for them
    ctx.eps = eps
    ctx.b_dtype = b.dtype if b is not None else None
    ctx.set_materialize_grads(False)
    return y


def _eager_backward(ctx, dy):
    x, w = ctx.saved_tensors
    mean, rstd = ctx.stats
    need = ctx.needs_input_grad
    dx, dw, db = _grads(dy, x, w, ctx.b_dtype, mean, rstd, ctx.eps, need[1], need[2], eager=True)
    return dx, dw, db, None


_eager_apply = _register.eager(
    "LayerNorm2d", _eager_forward, _eager_backward,
    "LayerNorm over dim 1 of contiguous (N, C, *) ``x`` on the NCHW kernels: ``apply(x, w, b, eps)`` -> ``y``.",
)


def serves(x: Tensor) -> bool:
    """Whether :func:`layer_norm2d_nchw` takes ``x``: a non-empty contiguous (N, C, *) tensor with
    more than one position, outside torch.func transforms (the row path serves the rest)."""
    return x.dim() >= 3 and x.numel() > 0 and x.is_contiguous() and x.numel() != x.shape[0] * x.shape[1] \
        and not _transforms.active()


def layer_norm2d_nchw(x: Tensor, w: Optional[Tensor], b: Optional[Tensor], eps: float) -> Tensor:
    """LayerNorm over dim 1 of a contiguous (N, C, *) ``x`` on the NCHW kernels (arguments checked,
    :func:`serves` true); the output is contiguous. The form that runs: ``_register.route``."""
    path = _register.route(x, w, b)
    if path == _register.EAGER:
        return _eager_apply(x, w, b, eps)
    if path == _register.PLAIN:
        return _forward2d(x, w, b, eps)[0]
    return layer_norm2d_fwd(x, w, b, eps)[0]  # COMPILE (serves() keeps transforms on the row path)


def layer_norm2d(x: Tensor, w: Optional[Tensor], b: Optional[Tensor], eps: float) -> Tensor:
    """The backend table's ``"cpu"`` LayerNorm2d: the NCHW kernels where they serve ``x``, else
    LayerNorm's row kernels on ``x.movedim(1, -1)`` (channels_last: no copy)."""
    if serves(x):
        return layer_norm2d_nchw(x, w, b, eps)
    return layer_norm2d_rows(_row_op.layer_norm, x, w, b, eps)
