"""``normlab warmup``: compile the ``"cpu"`` backend's kernels ahead of their first use.

Numba compiles a kernel the first time it runs for a dtype, and caches the
machine code on disk, so only the first process of a fresh install pays (a few
seconds per kernel; normlab prints one line on stderr when it happens).
:func:`warmup` pays it up front: it runs every op, forward and backward, on tiny
tensors of each dtype, once in the kernels' serial version (what small tensors,
one-thread runs and forked workers take) and once in their parallel version
(large tensors on several threads), so that later processes load everything
from the cache.

    normlab warmup                       # float32 and bfloat16, both versions
    normlab warmup --dtypes float32,float64,bfloat16,float16

From Python: ``normlab.warmup(dtypes=("float32",), progress=print)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from . import functional as F
from ._backend import use_backend
from .ops import _jit, _launch

__all__ = ["warmup", "targets", "DTYPES"]

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "float16": torch.float16}


def _leaf(*shape, dtype):
    return torch.randn(*shape, dtype=torch.float32).to(dtype).requires_grad_()


def _rows(dtype) -> None:
    """LayerNorm/RMSNorm and the fused adds (one forward and one backward kernel), and
    LayerNorm2d's NCHW kernels."""
    x, r, w, b = _leaf(4, 8, dtype=dtype), _leaf(4, 8, dtype=dtype), _leaf(8, dtype=dtype), _leaf(8, dtype=dtype)
    y, h = F.add_layer_norm(x, r, (8,), w, b)
    (y.sum() + h.sum() + F.layer_norm(x, (8,), w, b).sum() + F.rms_norm(x, (8,), w).sum()).backward()
    x2d = _leaf(2, 8, 2, 2, dtype=dtype)                      # LayerNorm2d's NCHW kernels
    F.layer_norm2d(x2d, w, b).sum().backward()


def _batch(dtype) -> None:
    """BatchNorm: forward, backward and the running-statistics update (planes and rows views)."""
    w, b = _leaf(3, dtype=dtype), _leaf(3, dtype=dtype)
    rm, rv = torch.zeros(3, dtype=dtype), torch.ones(3, dtype=dtype)
    for x in (_leaf(4, 3, 2, 2, dtype=dtype), _leaf(4, 3, dtype=dtype)):
        F.batch_norm(x, rm, rv, w, b, training=True).sum().backward()
        F.batch_norm(x, rm, rv, w, b, training=False).sum().backward()


def _groups(dtype) -> None:
    """GroupNorm/InstanceNorm: the NCHW, the NHWC and the S == 1 block kernels, forward and
    backward, and the update."""
    w, b = _leaf(4, dtype=dtype), _leaf(4, dtype=dtype)
    rm, rv = torch.zeros(4, dtype=dtype), torch.ones(4, dtype=dtype)
    channels_last = _leaf(2, 3, 4, dtype=dtype).transpose(1, 2)  # (2, 4, 3), channels fastest
    for x in (_leaf(2, 4, 3, dtype=dtype), channels_last, _leaf(2, 4, 1, dtype=dtype)):
        F.group_norm(x, 2, w, b).sum().backward()
    x = _leaf(2, 4, 3, dtype=dtype)
    F.instance_norm(x, rm, rv, w, b, use_input_stats=True).sum().backward()
    F.instance_norm(x, rm, rv, w, b, use_input_stats=False).sum().backward()


_FAMILIES = (("layer_norm", _rows), ("batch_norm", _batch), ("group_norm", _groups))


def targets(dtypes: Sequence[str] = ("float32", "bfloat16"), parallel: bool | None = None) -> list:
    """``[(label, run)]``: one entry per family, dtype and kernel version.

    ``parallel=None``: the parallel version too when numba may run threads here
    (more than one core and not a child forked after its parent's thread pool).
    """
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes:
        raise ValueError(f"normlab warmup: expected dtypes from {list(DTYPES)}, got {list(dtypes)}")
    if parallel is None:
        parallel = _launch._parallel_ok and (_jit.numba().config.NUMBA_NUM_THREADS > 1)
    versions = (False, True) if parallel else (False,)
    out = []
    for version in versions:
        for name in dtypes:
            for family, fn in _FAMILIES:
                label = f"{family} {name} {'parallel' if version else 'serial'}"
                out.append((label, (lambda fn=fn, dt=DTYPES[name], v=version: _run(fn, dt, v))))
    return out


def _run(fn: Callable, dtype: torch.dtype, parallel: bool) -> None:
    with use_backend("cpu"), _launch.forced_version(parallel), torch.enable_grad():
        fn(dtype)


def warmup(dtypes: Sequence[str] = ("float32", "bfloat16"), parallel: bool | None = None,
           progress: Callable[[str, int, int], None] | None = None) -> dict:
    """Compile (or load from the disk cache) every kernel for ``dtypes``; returns the seconds per target.

    ``progress(label, done, total)`` is called before each target.
    """
    if not _launch.available():
        raise RuntimeError("normlab warmup: numba is not installed, so there are no cpu kernels to compile; "
                           "pip install numba")
    todo = targets(dtypes, parallel)
    seconds = {}
    for i, (label, run) in enumerate(todo):
        if progress is not None:
            progress(label, i, len(todo))
        t0 = time.perf_counter()
        run()
        seconds[label] = round(time.perf_counter() - t0, 3)
    if progress is not None:
        progress("done", len(todo), len(todo))
    return seconds


# --- the command (normlab.cli) -------------------------------------------------------------


def add_arguments(parser) -> None:
    parser.add_argument("--dtypes", default="float32,bfloat16", metavar="LIST",
                        help=f"comma-separated, from {', '.join(DTYPES)} (default float32,bfloat16)")
    parser.add_argument("--serial-only", action="store_true",
                        help="compile only the serial kernels (small tensors, 1 thread, forked workers)")


def run(dtypes: str | Sequence[str] = "float32,bfloat16", serial_only: bool = False, show_progress: bool = True) -> dict:
    if isinstance(dtypes, str):
        dtypes = [d.strip() for d in dtypes.split(",") if d.strip()]
    parallel = False if serial_only else None
    todo = targets(dtypes, parallel)  # checks the arguments before any work
    t0 = time.perf_counter()
    if show_progress:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("{task.description:<34}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeElapsedColumn(), transient=False) as bar:
            task = bar.add_task("compiling", total=len(todo))

            def progress(label, done, total):
                bar.update(task, completed=done, description=label)

            seconds = warmup(dtypes, parallel, progress)
    else:
        seconds = warmup(dtypes, parallel)
    return {"seconds": seconds, "total_s": round(time.perf_counter() - t0, 3), "dtypes": list(dtypes)}


def render(result: dict) -> str:
    lines = [f"{label:<34} {s:7.2f} s" for label, s in result["seconds"].items()]
    lines.append(f"normlab warmup: {len(result['seconds'])} kernel groups ready in {result['total_s']:.1f} s "
                 f"(cached on disk: later processes load them in well under a second)")
    return "\n".join(lines)
