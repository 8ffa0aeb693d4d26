"""SyncBatchNorm's per-rank computations on each backend (no communication: ``sync.py`` gathers
and merges what these compute).

Per-channel vectors are numpy float64 arrays for CPU tensors (a numpy operation on a (C,)
vector costs a fraction of a torch one) and float64 tensors on the input's device otherwise;
the formulas are written once, with operators both understand.
"""

from typing import Callable, NamedTuple

import numpy as np
import torch
from torch import Tensor

from ..layouts import canonical
from ..numerics import acc_dtype
from .reference import _channel_sum, _mean_var_xc, _stat_shape, batch_norm_eval_ref


def empty_vectors(x: Tensor, c: int):
    return np.zeros(c) if x.is_cpu else torch.zeros(c, dtype=torch.float64, device=x.device)


def _kernel_stats(x: Tensor):
    """``(mean, M2)`` of this rank from the training kernel's statistics (its output y is not used)."""
    n = x.numel() // x.shape[1]
    sn = torch.ops.normlab.batch_norm_stats(x).numpy()  # (2, C): mean, biased var
    return sn[0], sn[1] * n


def _torch_stats(x: Tensor):
    """``(mean, M2)`` of this rank in torch ops (any device)."""
    n = x.numel() // x.shape[1]
    mean, var, _ = _mean_var_xc(x.to(acc_dtype(x.dtype)))  # (1, C, 1, ...) each
    mean, m2 = mean.reshape(-1).double(), var.reshape(-1).double() * n
    return (mean.numpy(), m2.numpy()) if x.is_cpu else (mean, m2)


def _kernel_normalize(x: Tensor, w, b, stats, eps: float) -> Tensor:
    """The evaluation kernel with the global statistics as its "running" ones."""
    return torch.ops.normlab.batch_norm_eval_fwd(x, w, b, torch.from_numpy(stats[0]), torch.from_numpy(stats[1]), eps)


def _torch_normalize(x: Tensor, w, b, stats, eps: float) -> Tensor:
    mean, var = (torch.from_numpy(stats[0]), torch.from_numpy(stats[1])) if x.is_cpu else (stats[0], stats[1])
    y, _, _ = batch_norm_eval_ref(x, mean, var, w, b, eps)
    return y


def _kernel_sums(dy: Tensor, x: Tensor, w, stats):
    _, dw, db = torch.ops.normlab.batch_norm_bwd(dy, x, w, torch.from_numpy(stats[:3]), False, False, True)
    return db.numpy(), dw.numpy()


def _torch_sums(dy: Tensor, x: Tensor, w, stats):
    acc = acc_dtype(x.dtype)
    shape = _stat_shape(x)
    mean, rstd = (torch.from_numpy(stats[0]), torch.from_numpy(stats[2])) if x.is_cpu else (stats[0], stats[2])
    x_hat = (x.to(acc) - mean.to(acc).reshape(shape)) * rstd.to(acc).reshape(shape)
    dya = dy.to(acc)
    db, dw = _channel_sum(dya).reshape(-1).double(), _channel_sum(dya * x_hat).reshape(-1).double()
    return (db.numpy(), dw.numpy()) if x.is_cpu else (db, dw)


class Parts(NamedTuple):
    """SyncBatchNorm's per-rank computations on one backend; the communication is shared.
    One per backend: ``KERNEL_PARTS`` ("cpu") and ``TORCH_PARTS`` ("ref")."""

    stats: Callable  # x -> (mean, M2) of this rank, float64 (C,)
    normalize: Callable  # (x, w, b, stats, eps) -> y with the global statistics
    sums: Callable  # (dy, x, w, stats) -> (sum dy, sum dy * x_hat), float64 (C,)
    canonical: Callable  # x -> the layout the computations take


KERNEL_PARTS = Parts(_kernel_stats, _kernel_normalize, _kernel_sums, canonical)


TORCH_PARTS = Parts(_torch_stats, _torch_normalize, _torch_sums, lambda x: x)
