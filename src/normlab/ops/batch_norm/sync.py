"""SyncBatchNorm: BatchNorm whose statistics span every rank of a ``torch.distributed`` group.

The layers' one module that runs ``torch.distributed`` collectives (``normlab.nn.SyncBatchNorm``
only asks which group to use). Works with any backend the group has: gloo on CPU tensors, NCCL
on GPU tensors.

Training forward, one collective::

    rank r:   n_r = values per channel here,  mean_r, M2_r = sum((x - mean_r)^2)   (float64, (C,))
    pack:     [MAGIC, C, dtype code, n_r, mean_r (C), M2_r (C)]                    (4 + 2C,) float64
    gather:   every rank receives every rank's pack                                (W, 4 + 2C)
    merge:    Chan's parallel formula, ranks in order 0, 1, ..., W-1 (skipping n_r = 0)::

                  delta = mean_b - mean_a,   n = n_a + n_b
                  mean  = mean_a + delta * n_b / n
                  M2    = M2_a + M2_b + delta^2 * n_a * n_b / n

    normalise: var = M2 / N (biased), rstd = 1 / sqrt(var + eps), y = (x - mean) * rstd * w + b

``E[x^2] - E[x]^2`` is never formed, neither on a rank nor across ranks. Every
rank merges the same packs in the same order, so the global statistics -- and
the running statistics blended from them with the unbiased variance
``M2 / (N - 1)`` -- are the same bits on every rank. A rank with no samples
sends ``n_r = 0`` and still takes part in both collectives.

Backward, one all-reduce of ``[sum(dy), sum(dy * x_hat)]`` (2C float64), then::

    dx = rstd * w * (dy - SUM(dy) / N - x_hat * SUM(dy * x_hat) / N)

with the global sums ``SUM`` and count ``N``: the gradient of BatchNorm over
the concatenated global batch. ``dw``/``db`` are the local sums (the data-parallel
wrapper averages parameter gradients across ranks). The derivation is the one
of ``docs/derivations/batch_norm.md`` with the batch means taken over every rank.

Agreement: before a layer's first synchronised forward the ranks exchange a
fixed-size header (``check=True``: ``[MAGIC, C, dtype code, 0]``), so ranks
that disagree on the number of channels raise a clear error on every rank
instead of feeding collectives of different sizes (gloo aborts the process
then); every later pack repeats the header, so a dtype that differs later is
caught too. Collective failures (a rank that crashed, or did not answer within
the group's timeout) are re-raised naming this rank and the cure.

Backends: ``"cpu"`` uses BatchNorm's C++ ops (``torch.ops.normlab``) for the local
statistics (``batch_norm_stats``: no output written), the normalisation with the
global statistics (``batch_norm_eval_fwd``) and the local backward sums
(``batch_norm_bwd``); ``dx`` is then a few elementwise torch ops.
``"ref"`` (and any tensor the kernels do not serve, e.g. CUDA) uses the
reference math of ``reference.py``.

Eager calls run :class:`_EagerSyncBatchNorm`; under ``torch.compile`` the
custom ops ``normlab::sync_batch_norm_fwd`` / ``_bwd`` /
``_update_stats`` run instead: their fake implementations communicate
nothing, so ``torch.compile(fullgraph=True)`` traces a model through them.

(No ``from __future__ import annotations``: ``torch.library`` reads the hints.)
"""

from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.function import once_differentiable

from ... import _backend
from ..layouts import output_memory_format
from ..numerics import acc_dtype, chan_merge  # noqa: F401 (chan_merge: also imported from here)
from .. import _register, extension
from .sync_parts import KERNEL_PARTS, TORCH_PARTS, Parts, empty_vectors
from .reference import _stat_shape
from .reference import update_running_stats

MAGIC = 7.25e5  # first value of every pack: a misaligned or foreign buffer does not start with it
HEADER = 4  # MAGIC, C, dtype code, values per channel on the rank
DTYPE_CODES = {torch.float32: 1.0, torch.float64: 2.0, torch.float16: 3.0, torch.bfloat16: 4.0}
_DTYPE_NAMES = {v: str(k).replace("torch.", "") for k, v in DTYPE_CODES.items()}

# --------------------------------------------------------------------------
# Groups and collectives
# --------------------------------------------------------------------------


def group_name(group) -> str:
    """The name a custom op gets for ``group`` (None: the default group)."""
    if group is None:
        group = dist.group.WORLD
    return group.group_name


def _resolve(name: str):
    return dist.distributed_c10d._resolve_process_group(name)


def _where(group) -> str:
    ranks = dist.get_process_group_ranks(group)
    return f"rank {dist.get_rank()} (of group ranks {ranks})"


def _failed(what: str, group, err: Exception) -> RuntimeError:
    return RuntimeError(
        f"normlab SyncBatchNorm: the {what} failed on {_where(group)}: {err}\n"
        f"A rank of the group has crashed, or did not reach this layer within the group's "
        f"timeout (ranks must run the same SyncBatchNorm layers in the same order, in "
        f"forward and backward). The timeout is the group's: "
        f"torch.distributed.init_process_group(..., timeout=datetime.timedelta(seconds=60)); "
        f"look for the first error in the other ranks' output."
    )


_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _all_gather(buf: Tensor, group, what: str) -> Tensor:
    """``(W, len(buf))``: every rank's ``buf`` in group-rank order (one collective)."""
    w = dist.get_world_size(group)
    out = buf.new_empty((w * buf.numel(),))
    try:
        _gather(out, buf, group=group)
    except RuntimeError as err:
        raise _failed(what, group, err) from err
    return out.reshape(w, buf.numel())


def _all_reduce(buf: Tensor, group, what: str) -> Tensor:
    try:
        dist.all_reduce(buf, group=group)
    except RuntimeError as err:
        raise _failed(what, group, err) from err
    return buf


def _check_headers(packs, group) -> None:
    """Every rank's header names the same C and dtype; raise the same error on every rank if not.

    ``packs``: ``(W, 4 + 2C)``, a numpy array or a tensor."""
    head = packs[:, :3]
    if not isinstance(head, np.ndarray):
        head = head.cpu().numpy()
    if head[0, 0] == MAGIC and (head == head[0]).all():
        return
    ranks = dist.get_process_group_ranks(group)
    said = "; ".join(
        f"rank {r}: {int(h[1])} channels, {_DTYPE_NAMES.get(h[2], '?')}" if h[0] == MAGIC else
        f"rank {r}: not a SyncBatchNorm pack"
        for r, h in zip(ranks, head.tolist())
    )
    raise RuntimeError(
        f"normlab SyncBatchNorm: the ranks of the group disagree on this layer's input: {said}. "
        f"Expected the same number of channels (num_features) and dtype on every rank; build the "
        f"model the same way on every rank and feed every rank inputs of the same dtype."
    )


def _header(c: int, dtype: torch.dtype, n: int) -> list:
    return [MAGIC, float(c), DTYPE_CODES[dtype], float(n)]


# --------------------------------------------------------------------------
# The math: local statistics, Chan's merge, normalisation, backward
#
# (the per-rank computations of each backend: sync_parts.py)
# --------------------------------------------------------------------------


def _local_stats(x: Tensor, parts):
    """``(n, mean, M2)`` of this rank: values per channel, float64 (C,) mean and sum of squared deviations."""
    c = x.shape[1]
    n = x.numel() // c
    if n == 0:
        z = empty_vectors(x, c)
        return 0, z, z
    return (n, *parts.stats(x))


def _global_stats(x: Tensor, eps: float, group, check: bool, parts):
    """``(4, C)`` float64 rows: the global mean, biased var, rstd and count ``N`` (numpy for CPU input)."""
    c = x.shape[1]
    if check:  # fixed-size header first: ranks with another C would otherwise send another size
        head = torch.tensor(_header(c, x.dtype, 0), dtype=torch.float64, device=x.device)
        _check_headers(_all_gather(head, group, "check of the ranks' inputs"), group)
    n, mean, m2 = _local_stats(x, parts)
    if x.is_cpu:
        pack = np.empty(HEADER + 2 * c)
        pack[:HEADER] = _header(c, x.dtype, n)
        pack[HEADER:HEADER + c] = mean
        pack[HEADER + c:] = m2
        packs = _all_gather(torch.from_numpy(pack), group, "all-gather of the batch statistics").numpy()
        stats = np.empty((4, c))
    else:
        head = torch.tensor(_header(c, x.dtype, n), dtype=torch.float64, device=x.device)
        packs = _all_gather(torch.cat([head, mean, m2]), group, "all-gather of the batch statistics")
        stats = x.new_empty((4, c), dtype=torch.float64)
    _check_headers(packs, group)  # (W, 4 + 2C)
    counts = packs[:, 3].tolist()
    total, mean, m2 = chan_merge(counts, packs[:, HEADER:HEADER + c], packs[:, HEADER + c:])
    if total <= 1:
        raise ValueError(
            f"Expected more than 1 value per channel when training, got {int(total)} value(s) per "
            f"channel over the {len(counts)} ranks of the group (this rank's input size {list(x.shape)})"
        )
    stats[0] = mean
    stats[1] = m2 / total  # biased: the normalisation uses it
    stats[2] = 1.0 / (stats[1] + eps) ** 0.5
    stats[3] = total
    return stats


def merge_moments(count: int, mean: Optional[Tensor], m2: Optional[Tensor], num_features: int, group=None):
    """Pool per-channel ``(count, mean, M2)`` of every rank of ``group``: one all-gather, Chan's merge.

    For statistics gathered over many batches on each rank (recalibration):
    ``mean``/``m2`` (C,) float64 tensors, or None when ``count`` is 0. Every rank
    of the group must call it, in the same order for each layer. Returns the
    pooled ``(count, mean, M2)`` on ``mean``'s device, the same bits on every rank
    (``0, None, None`` when no rank saw a value).
    """
    group = dist.group.WORLD if group is None else group
    c = num_features
    pack = torch.zeros(HEADER + 2 * c, dtype=torch.float64)
    pack[:HEADER] = torch.tensor(_header(c, torch.float64, count), dtype=torch.float64)
    if count:
        pack[HEADER:HEADER + c] = mean.detach().double().cpu()
        pack[HEADER + c:] = m2.detach().double().cpu()
    device = mean.device if mean is not None else torch.device("cpu")
    if dist.get_backend(group) == "nccl":  # NCCL moves CUDA tensors only
        pack = pack.cuda(device if device.type == "cuda" else None)
    packs = _all_gather(pack, group, "all-gather of the recalibration statistics").cpu()
    _check_headers(packs, group)
    total, mean, m2 = chan_merge(packs[:, 3].tolist(), packs[:, HEADER:HEADER + c], packs[:, HEADER + c:])
    if total == 0:
        return 0, None, None
    return int(total), mean.to(device), m2.to(device)


def _forward(x: Tensor, w, b, eps: float, group, check: bool, parts):
    """``(y, stats)``: SyncBatchNorm of ``x`` (canonical layout); ``stats`` as :func:`_global_stats`."""
    stats = _global_stats(x, eps, group, check, parts)
    if x.numel() == 0:
        return torch.empty_like(x), stats
    return parts.normalize(x, w, b, stats, eps), stats


def _local_sums(dy: Tensor, x: Tensor, w, stats, parts):
    """``(sum(dy), sum(dy * x_hat))`` of this rank, float64 (C,); x_hat with the global statistics."""
    if x.numel() == 0:
        z = empty_vectors(x, x.shape[1])
        return z, z
    return parts.sums(dy, x, w, stats)


def _records(*tensors) -> bool:
    """Whether autograd records the call: a transform or forward-mode AD is active, or grad mode
    is on and an input requires grad (then the eager Function, else the computation alone)."""
    if _backend.transforming():
        return True
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _parts(backend: str) -> Parts:
    return KERNEL_PARTS if backend == "cpu" else TORCH_PARTS


def _backward(dy: Tensor, x: Tensor, w, stats, group, parts):
    """``(dx, dw, db)``: dx of BatchNorm over the global batch (one all-reduce); this rank's dw, db
    (C,) float64, numpy for CPU input."""
    c = x.shape[1]
    db, dw = _local_sums(dy, x, w, stats, parts)
    if x.is_cpu:
        sums = _all_reduce(torch.from_numpy(np.concatenate([db, dw])), group, "all-reduce of the gradient sums")
        sums = sums.numpy()
    else:
        sums = _all_reduce(torch.cat([db, dw]), group, "all-reduce of the gradient sums")  # (2C,)
    if x.numel() == 0:
        return torch.empty_like(x), dw, db
    n, mean, rstd = stats[3, 0], stats[0], stats[2]
    acc = acc_dtype(x.dtype)
    # dx = a * (dy - m1 - x_hat * m2) = a * dy - k2 * (x - hi) - k0, per-channel constants in float64:
    if w is not None:
        w = w.detach().double()
        a = rstd * (w.cpu().numpy() if x.is_cpu else w)  # (C,)
    else:
        a = rstd
    k2 = a * (sums[c:] / n) * rstd  # (C,)  a * mean(dy * x_hat) * rstd
    if x.is_cpu:  # hi: the mean rounded to the accumulation dtype; lo = mean - hi
        hi = mean.astype(np.float32).astype(np.float64) if acc == torch.float32 else mean
    else:
        hi = mean.to(acc).double()
    k0 = a * (sums[:c] / n) - k2 * (mean - hi)  # (C,)  a * mean(dy) - k2 * lo
    shape = _stat_shape(x)
    coeffs = (np.stack([a, k2, k0, hi]) if x.is_cpu else torch.stack([a, k2, k0, hi]))
    coeffs = (torch.from_numpy(coeffs) if x.is_cpu else coeffs).to(acc)
    a, k2, k0, hi = (t.reshape(shape) for t in coeffs)
    dx = torch.addcmul(-k0, dy.to(acc), a).sub_((x.to(acc) - hi).mul_(k2))  # (N, C, *spatial)
    dx = dx.to(x.dtype).contiguous(memory_format=output_memory_format(x))
    return dx, dw, db


def _update(running_mean: Tensor, running_var: Tensor, stats, momentum: float) -> None:
    """Blend the global statistics into the running ones, in place (unbiased variance ``M2 / (N - 1)``)."""
    n = int(stats[3, 0])
    if isinstance(stats, np.ndarray) and running_mean.dtype in DTYPE_CODES and running_var.dtype in DTYPE_CODES:
        # the training forward's blend, in place (eager; version counters moved)
        extension.load().batch_norm_update(running_mean, running_var, torch.from_numpy(stats[:3]), n, float(momentum))
    else:
        stats = torch.as_tensor(stats, device=running_mean.device)
        update_running_stats(running_mean, running_var, stats[0], stats[1], n, momentum)


# --------------------------------------------------------------------------
# Custom ops (what torch.compile traces) and the eager Function
# --------------------------------------------------------------------------


def _sync_batch_norm_fwd(
    x: Tensor, w: Optional[Tensor], b: Optional[Tensor], eps: float, group: str, check: bool, backend: str
) -> tuple[Tensor, Tensor]:
    """SyncBatchNorm forward of a canonical ``x`` over the group named ``group``: ``(y, stats)``, stats (4, C)."""
    y, stats = _forward(x, w, b, eps, _resolve(group), check, _parts(backend))
    return y, _tensor(stats)


def _sync_batch_norm_fwd_fake(x, w, b, eps, group, check, backend):
    return torch.empty_like(x), x.new_empty((4, x.shape[1]), dtype=torch.float64)


def _sync_batch_norm_bwd(
    dy: Tensor, x: Tensor, w: Optional[Tensor], stats: Tensor, group: str, backend: str
) -> tuple[Tensor, Tensor, Tensor]:
    """SyncBatchNorm gradients ``(dx, dw, db)``, dw/db float64 local sums."""
    dx, dw, db = _backward(dy, x, w, _arrays(stats), _resolve(group), _parts(backend))
    return dx, _tensor(dw), _tensor(db)


def _sync_batch_norm_bwd_fake(dy, x, w, stats, group, backend):
    c = x.shape[1]
    return torch.empty_like(x), x.new_empty((c,), dtype=torch.float64), x.new_empty((c,), dtype=torch.float64)


sync_batch_norm_bwd = _register.custom_op(
    "sync_batch_norm_bwd", _sync_batch_norm_bwd, fake=_sync_batch_norm_bwd_fake, device_types=None
)


def _sync_batch_norm_update_stats(running_mean: Tensor, running_var: Tensor, stats: Tensor, momentum: Tensor) -> None:
    """Blend the global statistics into the running ones; ``momentum`` a 0-dim tensor, read when this runs."""
    _update(running_mean, running_var, _arrays(stats), float(momentum))


sync_batch_norm_update_stats = _register.custom_op(
    "sync_batch_norm_update_stats", _sync_batch_norm_update_stats,
    fake=lambda running_mean, running_var, stats, momentum: None,
    mutates_args=("running_mean", "running_var"), device_types=None,
)


def _tensor(a) -> Tensor:
    return torch.from_numpy(a) if isinstance(a, np.ndarray) else a


def _arrays(t: Tensor):
    """A CPU tensor of statistics as the numpy array the CPU math takes (no copy)."""
    return t.numpy() if t.is_cpu else t


def _cast(dw, db, w, b_dtype, need):
    """The local float64 ``dw``/``db`` (arrays or tensors) in the parameters' dtypes, None where not needed."""
    def to(a, dtype):
        return torch.from_numpy(a).to(dtype) if isinstance(a, np.ndarray) else a.to(dtype)
    return (to(dw, w.dtype) if need[1] and w is not None else None,
            to(db, b_dtype) if need[2] and b_dtype is not None else None)


def _setup(ctx, inputs, output):
    x, w, b, _, group, _, backend = inputs
    ctx.save_for_backward(x, w, output[1])
    ctx.mark_non_differentiable(output[1])
    ctx.group, ctx.backend, ctx.b_dtype = group, backend, (b.dtype if b is not None else None)


def _op_backward(ctx, dy, _dstats):
    x, w, stats = ctx.saved_tensors
    dx, dw, db = sync_batch_norm_bwd(dy, x, w, stats, ctx.group, ctx.backend)
    need = ctx.needs_input_grad
    dw, db = _cast(dw, db, w, ctx.b_dtype, need)
    return (dx if need[0] else None), dw, db, None, None, None, None


sync_batch_norm_fwd = _register.custom_op(
    "sync_batch_norm_fwd", _sync_batch_norm_fwd, fake=_sync_batch_norm_fwd_fake,
    backward=_op_backward, setup_context=_setup, device_types=None,
)


def _eager_forward(ctx, x, w, b, eps, group, check, backend, out):
    y, stats = _forward(x, w, b, eps, group, check, _parts(backend))
    ctx.save_for_backward(x, w)
    ctx.stats = out[0] = stats
    ctx.group, ctx.backend, ctx.b_dtype = group, backend, (b.dtype if b is not None else None)
    return y


@once_differentiable  # no double backward: a second derivative would need its own collectives
def _eager_backward(ctx, dy):
    x, w = ctx.saved_tensors
    dx, dw, db = _backward(dy, x, w, ctx.stats, ctx.group, _parts(ctx.backend))
    need = ctx.needs_input_grad
    dw, db = _cast(dw, db, w, ctx.b_dtype, need)
    return (dx if need[0] else None), dw, db, None, None, None, None, None


_eager_apply = _register.eager(
    "SyncBatchNorm", _eager_forward, _eager_backward,
    "SyncBatchNorm's training forward: ``apply(x, w, b, eps, group, check, backend, out)`` -> ``y``; "
    "``out[0]`` receives the (4, C) statistics.",
)


# --------------------------------------------------------------------------
# Entry point (called by normlab.nn.SyncBatchNorm)
# --------------------------------------------------------------------------


def sync_batch_norm(x, running_mean, running_var, w, b, momentum, eps, group=None, check=True):
    """Training-mode BatchNorm of an ``(N, C, *spatial)`` ``x`` with statistics over every rank of ``group``.

    ``group``: a process group (None: the default group) that this rank belongs
    to; every rank of it must make the same call. ``running_mean``/``running_var``
    (or None): updated in place, identically on every rank, with weight
    ``momentum`` (a float, or a 0-dim tensor) and the global unbiased variance.
    ``check``: first exchange a fixed-size header so that ranks disagreeing on
    the number of channels fail with a clear error (a layer's first call).
    A rank may hold no samples (``N == 0``); the ranks together must hold more
    than one value per channel. Arguments are assumed checked (``normlab.nn``).
    """
    if group is None:
        group = dist.group.WORLD
    path = _backend.route(x, "sync_batch_norm")
    backend = "ref" if path == _backend.REF else "cpu"  # its name: the custom ops carry it
    xc = _parts(backend).canonical(x)
    update = running_mean is not None
    # The custom ops are the traced form of either backend (collectives do not trace as torch
    # ops): COMPILE, and REF while torch.compile traces a tensor "cpu" does not serve.
    if not (path == _backend.COMPILE or (path == _backend.REF and torch.compiler.is_compiling())):
        # (no torch.func rule: under a transform, the eager Function)
        if _records(x, w, b):
            out = [None]
            y = _eager_apply(xc, w, b, eps, group, check, backend, out)
            stats = out[0]
        else:
            y, stats = _forward(xc, w, b, eps, group, check, _parts(backend))
        if update:
            _update(running_mean, running_var, stats, float(momentum))
        return y
    y, stats = sync_batch_norm_fwd(xc, w, b, eps, group_name(group), check, backend)
    if update:
        if not isinstance(momentum, Tensor):
            momentum = torch.tensor(momentum, dtype=torch.float64)
        sync_batch_norm_update_stats(running_mean, running_var, stats, momentum)
    return y

