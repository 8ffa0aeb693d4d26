"""One judgement of arguments: a table of valid, edge and invalid argument sets, each run through
normlab (``normlab.functional`` and ``normlab.nn``) on the ``"ref"`` and the ``"cpu"`` backend and
through torch beside it (``torch.nn.functional`` / ``torch.nn``: the oracle, computed live).

For every row:

- the two backends give the same verdict: both accept with the same values, or both refuse with the
  same exception class and the same message (one set of checks decides, whichever backend runs);
- against torch: both accept with the same values (``assert_close``, NaN at the same places; a zero
  of the other sign counts as the same value, and the test asserts the signs agree unless
  ``ZERO_SIGNS`` notes the row), or both refuse, normlab with torch's exception class (or a
  subclass of it);
- where normlab refuses deliberately (earlier than torch, where torch accepts, or with another
  class), ``DELIBERATE`` says so with the reason, the class and the message normlab gives, and the
  test asserts exactly that refusal on both backends -- and that torch does not already give the same
  verdict (a stale entry fails); an entry with no class is a deliberate acceptance of what torch refuses;
- ``PENDING`` rows are discrepancies whose fix belongs to files another change is restructuring: each
  names the change, runs, and must still fail (xfail; a row that passes makes its entry stale).

Functions and modules without a torch twin (the fused residual adds, LayerNorm2d, BatchRenorm,
GhostBatchNorm, FrozenBatchNorm) meet the torch composition they equal (``_TorchF``, ``_TorchNN``),
with arguments at which it is exact (``r_max=1, d_max=0``; one virtual batch).
"""

from __future__ import annotations

import math
import re
import types
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import normlab
import normlab.functional as NF
from tests.tools import timm_norm_act_standins as _timm_norm_act

inf, nan = math.inf, math.nan
BF16, F16, F32, F64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
CL, CL3 = torch.channels_last, torch.channels_last_3d


# ----------------------------------------------------------------------------
# the oracle: torch, and the torch compositions the twin-less entries equal
# ----------------------------------------------------------------------------


def _channels_last_ln(x, w, b, eps):
    return TF.layer_norm(x.movedim(1, -1), (x.shape[1],), w, b, eps).movedim(-1, 1)


def _timm_frn(x, w=None, b=None, tau=None, eps=1e-5):
    """timm's FilterResponseNormTlu2d forward on per-channel tensors (timm: filter_response_norm.py)."""
    v = (1, -1, 1, 1)
    y = x * x.square().mean(dim=(2, 3), keepdim=True).add(eps).rsqrt()
    y = y * w.view(v) if w is not None else y
    y = y + b.view(v) if b is not None else y
    return torch.maximum(y, tau.reshape(v)) if tau is not None else y


def _timm_rms_norm2d(x, w=None, eps=1e-6):  # timm's fast_norm.rms_norm2d
    y = x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + eps)
    return y * w.reshape(1, -1, 1, 1) if w is not None else y


def _timm_simple_norm(x, shape, w=None, eps=1e-6):  # timm's fast_norm.simple_norm (torch.var: unbiased)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    y = x * torch.rsqrt(torch.var(x, dim=tuple(range(-1, -len(shape) - 1, -1)), keepdim=True) + eps)
    return y * w if w is not None else y
def _torch_act(act, negative_slope):
    """torch's activation of that name (the composition the *_act functions equal)."""
    acts = {"identity": lambda z: z, "relu": TF.relu, "leaky_relu": lambda z: TF.leaky_relu(z, negative_slope),
            "silu": TF.silu, "gelu": TF.gelu, "gelu_tanh": lambda z: TF.gelu(z, approximate="tanh"),
            "hardswish": TF.hardswish, "tanh": torch.tanh}
    if act not in acts:
        raise ValueError(f"unknown activation {act!r}")
    return acts[act]


_TorchF = types.SimpleNamespace(
    # timm's other norms, as timm computes them
    rms_norm2d=_timm_rms_norm2d,
    simple_norm=_timm_simple_norm,
    simple_norm2d=lambda x, w=None, eps=1e-6: _timm_simple_norm(x.permute(0, 2, 3, 1), x.shape[1], w, eps).permute(
        0, 3, 1, 2),
    filter_response_norm=_timm_frn,
    layer_norm=TF.layer_norm,
    rms_norm=TF.rms_norm,
    batch_norm=TF.batch_norm,
    group_norm=TF.group_norm,
    instance_norm=TF.instance_norm,
    local_response_norm=TF.local_response_norm,
    # h = x + residual, then the norm of h
    add_layer_norm=lambda x, r, shape, w=None, b=None, eps=1e-5: (TF.layer_norm(x + r, shape, w, b, eps), x + r),
    add_rms_norm=lambda x, r, shape, w=None, eps=None: (TF.rms_norm(x + r, shape, w, eps), x + r),
    # LayerNorm over dim 1
    layer_norm2d=lambda x, w=None, b=None, eps=1e-6: _channels_last_ln(x, w, b, eps),
    # r_max=1, d_max=0: BatchNorm exactly
    batch_renorm=lambda x, rm, rv, w=None, b=None, training=False, momentum=0.1, eps=1e-5, r_max=3.0, d_max=5.0:
        TF.batch_norm(x, rm, rv, w, b, training, momentum, eps),
    # one virtual batch (virtual_batch_size >= N): BatchNorm exactly
    ghost_batch_norm=lambda x, vbs, rm=None, rv=None, w=None, b=None, training=True, momentum=0.1, eps=1e-5:
        TF.batch_norm(x, rm, rv, w, b, training, momentum, eps),
    # the norm, then the activation
    batch_norm_act=lambda x, rm, rv, w=None, b=None, training=False, momentum=0.1, eps=1e-5, act="relu",
        negative_slope=0.01: _torch_act(act, negative_slope)(TF.batch_norm(x, rm, rv, w, b, training, momentum, eps)),
    group_norm_act=lambda x, g, w=None, b=None, eps=1e-5, act="relu", negative_slope=0.01:
        _torch_act(act, negative_slope)(TF.group_norm(x, g, w, b, eps)),
    layer_norm_act=lambda x, shape, w=None, b=None, eps=1e-5, act="relu", negative_slope=0.01:
        _torch_act(act, negative_slope)(TF.layer_norm(x, shape, w, b, eps)),
    layer_norm_act2d=lambda x, w=None, b=None, eps=1e-5, act="relu", negative_slope=0.01:
        _torch_act(act, negative_slope)(_channels_last_ln(x, w, b, eps)),
)


class _TorchLayerNorm2d(torch.nn.LayerNorm):
    def __init__(self, num_channels, eps=1e-6, affine=True, device=None, dtype=None):
        super().__init__(num_channels, eps, affine, device=device, dtype=dtype)

    def forward(self, x):
        return _channels_last_ln(x, self.weight, self.bias, self.eps)


def _torch_batch_norm(dims):
    return {1: torch.nn.BatchNorm1d, 2: torch.nn.BatchNorm2d, 3: torch.nn.BatchNorm3d}[dims]


def _renorm_twin(dims):
    def make(num_features, eps=1e-5, momentum=0.1, affine=True, r_max=3.0, d_max=5.0, warmup_steps=0, **kw):
        return _torch_batch_norm(dims)(num_features, eps, momentum, affine, True, **kw)
    return make


def _ghost_twin(dims):
    def make(num_features, virtual_batch_size, *args, **kw):
        return _torch_batch_norm(dims)(num_features, *args, **kw)
    return make


def _frozen_twin(dims):
    def make(num_features, eps=1e-5, device=None, dtype=None):
        m = _torch_batch_norm(dims)(num_features, eps, device=device, dtype=dtype)
        m.eval()
        m.train = lambda mode=True: m  # frozen: eval whatever is asked
        m.num_batches_tracked = None  # FrozenBatchNorm has no count (and eval never reads it)
        return m
    return make


_TorchNN = types.SimpleNamespace(
    **{name: getattr(torch.nn, name) for name in dir(torch.nn) if name[0].isupper()},
    LayerNorm2d=_TorchLayerNorm2d,
    **{f"BatchRenorm{d}d": _renorm_twin(d) for d in (1, 2, 3)},
    **{f"GhostBatchNorm{d}d": _ghost_twin(d) for d in (1, 2, 3)},
    **{f"FrozenBatchNorm{d}d": _frozen_twin(d) for d in (1, 2, 3)},
    # timm's norm+act classes (faithful stand-ins): the norm, then the activation
    **{cls.__name__: cls for cls in _timm_norm_act.CLASSES},
)

TORCH = types.SimpleNamespace(F=_TorchF, nn=_TorchNN)
NORMLAB = types.SimpleNamespace(F=NF, nn=normlab.nn)


# ----------------------------------------------------------------------------
# inputs: tiny, deterministic, made afresh for every run (the running statistics change in place)
# ----------------------------------------------------------------------------


def X(*shape, dtype=F32, fmt=None, seed=0):
    g = torch.Generator().manual_seed(seed + 7 * len(shape) + sum(shape))
    t = torch.randn(shape, generator=g, dtype=F64).to(dtype)
    return t.contiguous(memory_format=fmt) if fmt is not None else t


def P(c, dtype=F32, seed=1):
    """A per-channel / per-column parameter: values about 1, none 0."""
    return X(c, dtype=dtype, seed=seed).abs() + 0.5


def Z(c, dtype=F32):
    return torch.zeros(c, dtype=dtype)


def O(c, dtype=F32):
    return torch.ones(c, dtype=dtype)


def fwd(module, *inputs, train=None, steps=1):
    """``module`` (in ``train`` mode if given) applied ``steps`` times; its output and state."""
    if train is not None:
        module.train(train)
    for _ in range(steps):
        y = module(*inputs)
    return (y, *(t for _, t in sorted(module.state_dict().items())))


# ----------------------------------------------------------------------------
# the table
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    id: str
    run: Callable  # run(lib): lib.F is torch.nn.functional or normlab.functional, lib.nn torch.nn or normlab.nn


ROWS: list[Row] = []


def row(id_, run):
    assert id_ not in {r.id for r in ROWS}, id_
    ROWS.append(Row(id_, run))


# eps values every function meets
EPS = {"0": 0.0, "inf": inf, "nan": nan, "-1e-5": -1e-5, "int 1": 1, "bool": True, "numpy": np.float64(1e-3),
       "str": "1e-5"}

# --- layer_norm --------------------------------------------------------------
for k, e in EPS.items():
    row(f"layer_norm eps={k}", lambda L, e=e: L.F.layer_norm(X(4, 8), (8,), eps=e))
    row(f"layer_norm affine eps={k}", lambda L, e=e: L.F.layer_norm(X(4, 8), (8,), P(8), P(8, seed=2), eps=e))
row("layer_norm valid", lambda L: L.F.layer_norm(X(2, 3, 8), (8,), P(8), P(8, seed=2)))
row("layer_norm 2 dims", lambda L: L.F.layer_norm(X(2, 3, 4), (3, 4), P((3, 4)), None))
row("layer_norm shape int", lambda L: L.F.layer_norm(X(4, 8), 8))
row("layer_norm shape list", lambda L: L.F.layer_norm(X(4, 8), [8]))
row("layer_norm shape Size", lambda L: L.F.layer_norm(X(4, 8), torch.Size([8])))
row("layer_norm shape wrong", lambda L: L.F.layer_norm(X(4, 8), (7,)))
row("layer_norm shape empty", lambda L: L.F.layer_norm(X(4, 8), ()))
row("layer_norm shape too long", lambda L: L.F.layer_norm(X(4, 8), (2, 4, 8)))
row("layer_norm shape negative", lambda L: L.F.layer_norm(X(4, 8), (-8,)))
row("layer_norm shape float", lambda L: L.F.layer_norm(X(4, 8), (8.0,)))
row("layer_norm 0 rows", lambda L: L.F.layer_norm(X(0, 8), (8,), P(8), P(8)))
row("layer_norm 0 columns", lambda L: L.F.layer_norm(X(4, 0), (0,)))
row("layer_norm one column", lambda L: L.F.layer_norm(X(4, 1), (1,)))
row("layer_norm weight wrong", lambda L: L.F.layer_norm(X(4, 8), (8,), P(7)))
row("layer_norm weight broadcast", lambda L: L.F.layer_norm(X(4, 8), (8,), P(1)))
row("layer_norm bias broadcast", lambda L: L.F.layer_norm(X(4, 8), (8,), P(8), P(1)))
row("layer_norm weight 2-D", lambda L: L.F.layer_norm(X(4, 8), (8,), P((1, 8))))
row("layer_norm bf16 x f32 weight", lambda L: L.F.layer_norm(X(4, 8, dtype=BF16), (8,), P(8), P(8)))
row("layer_norm f16 x f32 weight", lambda L: L.F.layer_norm(X(4, 8, dtype=F16), (8,), P(8), P(8)))
row("layer_norm f32 x f64 weight", lambda L: L.F.layer_norm(X(4, 8), (8,), P(8, F64), P(8, F64)))
row("layer_norm f32 x bf16 weight", lambda L: L.F.layer_norm(X(4, 8), (8,), P(8, BF16)))
row("layer_norm bf16", lambda L: L.F.layer_norm(X(4, 8, dtype=BF16), (8,), P(8, BF16), P(8, BF16)))
row("layer_norm f64", lambda L: L.F.layer_norm(X(4, 8, dtype=F64), (8,), P(8, F64), P(8, F64)))
row("layer_norm int input", lambda L: L.F.layer_norm(torch.arange(32).view(4, 8), (8,)))
row("layer_norm list input", lambda L: L.F.layer_norm([[1.0, 2.0]], (2,)))
row("layer_norm 0-d input", lambda L: L.F.layer_norm(torch.tensor(1.0), (1,)))
row("layer_norm weight list", lambda L: L.F.layer_norm(X(4, 2), (2,), [1.0, 1.0]))
row("layer_norm non-contiguous", lambda L: L.F.layer_norm(X(8, 4).t(), (8,), P(8), P(8)))
row("layer_norm strided rows", lambda L: L.F.layer_norm(X(4, 16)[:, ::2], (8,)))
row("layer_norm channels_last", lambda L: L.F.layer_norm(X(2, 3, 4, 4, fmt=CL), (4,), P(4)))
row("layer_norm nan input", lambda L: L.F.layer_norm(X(4, 8).index_fill(1, torch.tensor([3]), nan), (8,)))
row("layer_norm inf input", lambda L: L.F.layer_norm(X(4, 8).index_fill(1, torch.tensor([3]), inf), (8,)))
row("layer_norm weight zeros", lambda L: L.F.layer_norm(X(4, 8), (8,), Z(8)))
row("layer_norm eps=None", lambda L: L.F.layer_norm(X(4, 8), (8,), eps=None))
row("layer_norm bias only eps=inf", lambda L: L.F.layer_norm(X(4, 8), (8,), None, P(8), eps=inf))

# --- rms_norm ----------------------------------------------------------------
for k, e in {**EPS, "None": None}.items():
    row(f"rms_norm eps={k}", lambda L, e=e: L.F.rms_norm(X(4, 8), (8,), P(8), eps=e))
row("rms_norm no weight eps=inf", lambda L: L.F.rms_norm(X(4, 8), (8,), None, inf))
row("rms_norm shape wrong", lambda L: L.F.rms_norm(X(4, 8), (4,)))
row("rms_norm shape empty", lambda L: L.F.rms_norm(X(4, 8), ()))
row("rms_norm shape int", lambda L: L.F.rms_norm(X(4, 8), 8))
row("rms_norm 0 rows", lambda L: L.F.rms_norm(X(0, 8), (8,), P(8)))
row("rms_norm 0 columns", lambda L: L.F.rms_norm(X(3, 0), (0,)))
row("rms_norm weight wrong", lambda L: L.F.rms_norm(X(4, 8), (8,), P(4)))
row("rms_norm weight broadcast", lambda L: L.F.rms_norm(X(4, 8), (8,), P(1)))
row("rms_norm bf16 x f32 weight", lambda L: L.F.rms_norm(X(4, 8, dtype=BF16), (8,), P(8)))
row("rms_norm f16 x f32 weight", lambda L: L.F.rms_norm(X(4, 8, dtype=F16), (8,), P(8)))
row("rms_norm f32 x f64 weight", lambda L: L.F.rms_norm(X(4, 8), (8,), P(8, F64)))
row("rms_norm f32 x bf16 weight", lambda L: L.F.rms_norm(X(4, 8), (8,), P(8, BF16)))
row("rms_norm int input", lambda L: L.F.rms_norm(torch.arange(32).view(4, 8), (8,)))
row("rms_norm list input", lambda L: L.F.rms_norm([[1.0, 2.0]], (2,)))
row("rms_norm non-contiguous", lambda L: L.F.rms_norm(X(8, 4).t(), (8,), P(8)))
row("rms_norm channels_last", lambda L: L.F.rms_norm(X(2, 3, 4, 4, fmt=CL), (4,), P(4)))
row("rms_norm weight zeros", lambda L: L.F.rms_norm(X(4, 8), (8,), Z(8)))

# --- add_layer_norm, add_rms_norm ---------------------------------------------
for k in ("0", "inf", "nan", "-1e-5", "int 1", "bool"):
    row(f"add_layer_norm eps={k}", lambda L, e=EPS[k]: L.F.add_layer_norm(X(4, 8), X(4, 8, seed=3), (8,), eps=e))
    row(f"add_rms_norm eps={k}", lambda L, e=EPS[k]: L.F.add_rms_norm(X(4, 8), X(4, 8, seed=3), (8,), P(8), eps=e))
row("add_layer_norm valid", lambda L: L.F.add_layer_norm(X(2, 3, 8), X(2, 3, 8, seed=3), (8,), P(8), P(8)))
row("add_rms_norm eps=None", lambda L: L.F.add_rms_norm(X(2, 3, 8), X(2, 3, 8, seed=3), (8,), P(8)))
row("add_layer_norm residual broadcast", lambda L: L.F.add_layer_norm(X(4, 8), X(1, 8), (8,)))
row("add_rms_norm residual broadcast", lambda L: L.F.add_rms_norm(X(4, 8), X(8), (8,)))
row("add_layer_norm residual f64", lambda L: L.F.add_layer_norm(X(4, 8), X(4, 8, dtype=F64), (8,)))
row("add_layer_norm residual int", lambda L: L.F.add_layer_norm(X(4, 8), torch.ones(4, 8, dtype=torch.int64), (8,)))
row("add_layer_norm weight wrong", lambda L: L.F.add_layer_norm(X(4, 8), X(4, 8), (8,), P(7)))
row("add_layer_norm shape wrong", lambda L: L.F.add_layer_norm(X(4, 8), X(4, 8), (7,)))
row("add_rms_norm bf16 x f32 weight", lambda L: L.F.add_rms_norm(X(4, 8, dtype=BF16), X(4, 8, dtype=BF16), (8,), P(8)))
row("add_layer_norm int input", lambda L: L.F.add_layer_norm(torch.ones(4, 8, dtype=torch.int64),
                                                             torch.ones(4, 8, dtype=torch.int64), (8,)))
row("add_layer_norm non-contiguous", lambda L: L.F.add_layer_norm(X(8, 4).t(), X(8, 4, seed=3).t(), (8,)))
row("add_layer_norm 0 rows", lambda L: L.F.add_layer_norm(X(0, 8), X(0, 8), (8,)))

# --- layer_norm2d -------------------------------------------------------------
for k in ("0", "inf", "nan", "-1e-5", "int 1", "bool"):
    row(f"layer_norm2d eps={k}", lambda L, e=EPS[k]: L.F.layer_norm2d(X(2, 6, 3, 3), P(6), None, eps=e))
row("layer_norm2d valid", lambda L: L.F.layer_norm2d(X(2, 6, 3, 3), P(6), P(6, seed=2)))
row("layer_norm2d channels_last", lambda L: L.F.layer_norm2d(X(2, 6, 3, 3, fmt=CL), P(6), P(6, seed=2)))
row("layer_norm2d 3-D input", lambda L: L.F.layer_norm2d(X(2, 6, 5), P(6)))
row("layer_norm2d weight wrong", lambda L: L.F.layer_norm2d(X(2, 6, 3, 3), P(3)))
row("layer_norm2d weight broadcast", lambda L: L.F.layer_norm2d(X(2, 6, 3, 3), P(1)))
row("layer_norm2d bf16 x f32 weight", lambda L: L.F.layer_norm2d(X(2, 6, 3, 3, dtype=BF16), P(6), P(6)))
row("layer_norm2d f32 x f64 weight", lambda L: L.F.layer_norm2d(X(2, 6, 3, 3), P(6, F64), P(6, F64)))
row("layer_norm2d int input", lambda L: L.F.layer_norm2d(torch.ones(2, 6, 3, 3, dtype=torch.int64)))
row("layer_norm2d 0 batch", lambda L: L.F.layer_norm2d(X(0, 6, 3, 3), P(6)))
row("layer_norm2d non-contiguous", lambda L: L.F.layer_norm2d(X(2, 3, 3, 6).permute(0, 3, 2, 1), P(6)))


# --- timm's other norms: rms_norm2d, simple_norm, simple_norm2d, filter_response_norm -----------
for k in ("0", "inf", "nan", "-1e-5", "int 1", "bool", "str"):
    row(f"rms_norm2d eps={k}", lambda L, e=EPS[k]: L.F.rms_norm2d(X(2, 6, 3, 3), P(6), eps=e))
    row(f"simple_norm2d eps={k}", lambda L, e=EPS[k]: L.F.simple_norm2d(X(2, 6, 3, 3), P(6), eps=e))
    row(f"filter_response_norm eps={k}", lambda L, e=EPS[k]: L.F.filter_response_norm(X(2, 6, 3, 3), P(6), eps=e))
row("rms_norm2d valid", lambda L: L.F.rms_norm2d(X(2, 6, 3, 3), P(6)))
row("rms_norm2d channels_last", lambda L: L.F.rms_norm2d(X(2, 6, 3, 3, fmt=CL), P(6)))
row("rms_norm2d weight wrong", lambda L: L.F.rms_norm2d(X(2, 6, 3, 3), P(4)))
row("rms_norm2d bf16", lambda L: L.F.rms_norm2d(X(2, 6, 3, 3, dtype=BF16), P(6, BF16)))
row("rms_norm2d f64", lambda L: L.F.rms_norm2d(X(2, 6, 3, 3, dtype=F64), P(6, F64)))
row("simple_norm valid", lambda L: L.F.simple_norm(X(2, 3, 8), (8,), P(8)))
row("simple_norm 2 dims", lambda L: L.F.simple_norm(X(2, 3, 4), (3, 4), P((3, 4))))
row("simple_norm one column", lambda L: L.F.simple_norm(X(4, 1), (1,)))
row("simple_norm weight wrong", lambda L: L.F.simple_norm(X(4, 8), (8,), P(7)))
row("simple_norm2d valid", lambda L: L.F.simple_norm2d(X(2, 6, 3, 3), P(6)))
row("simple_norm2d channels_last", lambda L: L.F.simple_norm2d(X(2, 6, 3, 3, fmt=CL), P(6)))
row("filter_response_norm valid", lambda L: L.F.filter_response_norm(X(2, 6, 3, 3), P(6), X(6, seed=3), X(6, seed=4)))
row("filter_response_norm no affine", lambda L: L.F.filter_response_norm(X(2, 6, 3, 3)))
row("filter_response_norm channels_last",
    lambda L: L.F.filter_response_norm(X(2, 6, 3, 3, fmt=CL), P(6), X(6, seed=3), X(6, seed=4)))
row("filter_response_norm tau wrong", lambda L: L.F.filter_response_norm(X(2, 6, 3, 3), P(6), None, X(4)))
row("filter_response_norm f64", lambda L: L.F.filter_response_norm(X(2, 6, 3, 3, dtype=F64), tau=Z(6, F64)))


# --- batch_norm ---------------------------------------------------------------
def _bn(L, x=None, stats=True, w=True, b=True, training=True, momentum=0.1, eps=1e-5, rm=None, rv=None, c=6):
    x = X(4, c, 5) if x is None else x
    if stats and rm is None and rv is None:
        rm, rv = X(c, seed=5), P(c, seed=6)
    w = P(c) if w is True else (None if w is False else w)
    b = P(c, seed=2) if b is True else (None if b is False else b)
    y = L.F.batch_norm(x, rm, rv, w, b, training, momentum, eps)
    return y, rm, rv


for k, e in EPS.items():
    row(f"batch_norm train eps={k}", lambda L, e=e: _bn(L, eps=e))
    row(f"batch_norm eval eps={k}", lambda L, e=e: _bn(L, training=False, eps=e))
for k, m in {"0": 0.0, "1": 1.0, "None": None, "-0.1": -0.1, "1.5": 1.5, "nan": nan, "int 1": 1, "bool": True,
             "str": "0.1"}.items():
    row(f"batch_norm momentum={k}", lambda L, m=m: _bn(L, momentum=m))
row("batch_norm train no stats momentum=None", lambda L: _bn(L, stats=False, momentum=None))
row("batch_norm eval momentum=1.5", lambda L: _bn(L, training=False, momentum=1.5))
row("batch_norm train no stats", lambda L: _bn(L, stats=False))
row("batch_norm eval no stats", lambda L: _bn(L, stats=False, training=False))
row("batch_norm train running_var None", lambda L: _bn(L, stats=False, rm=Z(6)))
row("batch_norm train running_mean None", lambda L: _bn(L, stats=False, rv=O(6)))
row("batch_norm eval running_var None", lambda L: _bn(L, stats=False, rm=Z(6), training=False))
row("batch_norm eval running_mean None", lambda L: _bn(L, stats=False, rv=O(6), training=False))
row("batch_norm one value per channel", lambda L: _bn(L, x=X(1, 6)))
row("batch_norm one value per channel eval", lambda L: _bn(L, x=X(1, 6), training=False))
row("batch_norm one value per channel 3-D", lambda L: _bn(L, x=X(1, 6, 1)))
row("batch_norm 0 batch train", lambda L: _bn(L, x=X(0, 6, 5)))
row("batch_norm 0 batch eval", lambda L: _bn(L, x=X(0, 6, 5), training=False))
row("batch_norm 0 channels", lambda L: _bn(L, x=X(4, 0, 5), c=0))
row("batch_norm 1-D input", lambda L: _bn(L, x=X(6)))
row("batch_norm weight wrong", lambda L: _bn(L, w=P(5)))
row("batch_norm weight broadcast", lambda L: _bn(L, w=P(1)))
row("batch_norm bias broadcast", lambda L: _bn(L, b=P(1)))
row("batch_norm running_mean wrong", lambda L: _bn(L, rm=Z(5), rv=O(6)))
row("batch_norm running_mean broadcast eval", lambda L: _bn(L, rm=Z(1), rv=O(6), training=False))
row("batch_norm bf16 x f32 params", lambda L: _bn(L, x=X(4, 6, 5, dtype=BF16)))
row("batch_norm f16 x f32 params", lambda L: _bn(L, x=X(4, 6, 5, dtype=F16), training=False))
row("batch_norm f32 x f64 params", lambda L: _bn(L, rm=Z(6, F64), rv=O(6, F64), w=P(6, F64), b=P(6, F64)))
row("batch_norm f32 x f64 weight", lambda L: _bn(L, w=P(6, F64)))
row("batch_norm bf16 x f32 weight bf16 stats", lambda L: _bn(L, x=X(4, 6, 5, dtype=BF16), rm=Z(6, BF16), rv=O(6, BF16)))
row("batch_norm int input", lambda L: _bn(L, x=torch.ones(4, 6, 5, dtype=torch.int64)))
row("batch_norm list input", lambda L: _bn(L, x=[[1.0] * 6] * 4))
row("batch_norm channels_last", lambda L: _bn(L, x=X(2, 6, 3, 3, fmt=CL)))
row("batch_norm channels_last_3d", lambda L: _bn(L, x=X(2, 6, 2, 2, 2, fmt=CL3), training=False))
row("batch_norm non-contiguous", lambda L: _bn(L, x=X(5, 6, 4).transpose(0, 2)[:4].transpose(0, 2)[:, :, :4]
                                                 .transpose(0, 2)))
row("batch_norm train no bias eps=inf", lambda L: _bn(L, b=False, eps=inf))
row("batch_norm eval no bias eps=inf", lambda L: _bn(L, b=False, eps=inf, training=False))
row("batch_norm weight zeros", lambda L: _bn(L, w=Z(6), b=False))
row("batch_norm eval weight zeros", lambda L: _bn(L, w=Z(6), b=False, training=False))


# --- group_norm ---------------------------------------------------------------
def _gn(L, g=3, x=None, w=True, b=True, eps=1e-5):
    x = X(4, 6, 5) if x is None else x
    c = x.shape[1] if isinstance(x, torch.Tensor) and x.dim() > 1 else 6
    w = P(c) if w is True else (None if w is False else w)
    b = P(c, seed=2) if b is True else (None if b is False else b)
    return L.F.group_norm(x, g, w, b, eps)


for k, e in EPS.items():
    row(f"group_norm eps={k}", lambda L, e=e: _gn(L, eps=e))
for k, g in {"1": 1, "6": 6, "0": 0, "-3": -3, "4": 4, "bool": True, "float": 3.0, "numpy": np.int64(2),
             "12": 12}.items():
    row(f"group_norm num_groups={k}", lambda L, g=g: _gn(L, g))
row("group_norm one value per group", lambda L: _gn(L, 6, x=X(1, 6)))
row("group_norm one value per group 3-D", lambda L: _gn(L, 6, x=X(1, 6, 1)))
row("group_norm 2 values per group", lambda L: _gn(L, 3, x=X(1, 6)))
row("group_norm 0 batch", lambda L: _gn(L, x=X(0, 6, 5)))
row("group_norm 0 spatial", lambda L: _gn(L, x=X(2, 6, 0)))
row("group_norm 1-D input", lambda L: _gn(L, x=X(6)))
row("group_norm weight wrong", lambda L: _gn(L, w=P(3)))
row("group_norm weight broadcast", lambda L: _gn(L, w=P(1)))
row("group_norm bf16 x f32 weight", lambda L: _gn(L, x=X(4, 6, 5, dtype=BF16)))
row("group_norm f32 x f64 weight", lambda L: _gn(L, w=P(6, F64), b=P(6, F64)))
row("group_norm int input", lambda L: _gn(L, x=torch.ones(4, 6, 5, dtype=torch.int64), w=False, b=False))
row("group_norm channels_last", lambda L: _gn(L, x=X(2, 6, 3, 3, fmt=CL)))
row("group_norm no bias eps=inf", lambda L: _gn(L, b=False, eps=inf))
row("group_norm weight zeros", lambda L: _gn(L, w=Z(6), b=False))
row("group_norm non-contiguous", lambda L: _gn(L, x=X(5, 6, 4).transpose(0, 2)))


# --- instance_norm ------------------------------------------------------------
def _in(L, x=None, stats=False, w=False, b=False, use_input_stats=True, momentum=0.1, eps=1e-5, rm=None, rv=None):
    x = X(4, 6, 5) if x is None else x
    c = 6
    if stats and rm is None and rv is None:
        rm, rv = X(c, seed=5), P(c, seed=6)
    w = P(c) if w is True else (None if w is False else w)
    b = P(c, seed=2) if b is True else (None if b is False else b)
    y = L.F.instance_norm(x, rm, rv, w, b, use_input_stats, momentum, eps)
    return y, rm, rv


for k, e in EPS.items():
    row(f"instance_norm eps={k}", lambda L, e=e: _in(L, eps=e, w=True, b=True))
row("instance_norm eval stats eps=0", lambda L: _in(L, stats=True, use_input_stats=False, eps=0.0))
for k, m in {"0": 0.0, "1": 1.0, "-0.1": -0.1, "1.5": 1.5, "nan": nan}.items():
    row(f"instance_norm momentum={k}", lambda L, m=m: _in(L, stats=True, momentum=m))
row("instance_norm no stats momentum=1.5", lambda L: _in(L, momentum=1.5))
row("instance_norm use_input_stats=False no stats", lambda L: _in(L, use_input_stats=False))
row("instance_norm use_input_stats=False", lambda L: _in(L, stats=True, use_input_stats=False, w=True))
row("instance_norm running_var None", lambda L: _in(L, rm=Z(6)))
row("instance_norm one spatial value", lambda L: _in(L, x=X(4, 6, 1)))
row("instance_norm 2-D input", lambda L: _in(L, x=X(4, 6)))
row("instance_norm 0 batch", lambda L: _in(L, x=X(0, 6, 5)))
row("instance_norm weight wrong", lambda L: _in(L, w=P(4)))
row("instance_norm weight broadcast", lambda L: _in(L, w=P(1)))
row("instance_norm bf16 x f32 weight", lambda L: _in(L, x=X(4, 6, 5, dtype=BF16), w=True))
row("instance_norm f32 x f64 weight", lambda L: _in(L, w=P(6, F64)))
row("instance_norm int input", lambda L: _in(L, x=torch.ones(4, 6, 5, dtype=torch.int64)))
row("instance_norm eps=inf no affine", lambda L: _in(L, eps=inf))
row("instance_norm weight zeros", lambda L: _in(L, w=Z(6)))
row("instance_norm eval eps=inf", lambda L: _in(L, stats=True, use_input_stats=False, eps=inf))
row("instance_norm channels_last", lambda L: _in(L, x=X(2, 6, 3, 3, fmt=CL), w=True, b=True))


# --- batch_renorm, ghost_batch_norm (BatchNorm's arguments; the oracle: batch_norm) ----
def _renorm(L, training=True, momentum=0.1, eps=1e-5, x=None, w=True):
    x = X(4, 6, 5) if x is None else x
    rm, rv = X(6, seed=5), P(6, seed=6)
    w = P(6) if w is True else w
    return L.F.batch_renorm(x, rm, rv, w, P(6, seed=2), training, momentum, eps, 1.0, 0.0), rm, rv


def _ghost(L, training=True, momentum=0.1, eps=1e-5, x=None, w=True, stats=True):
    x = X(4, 6, 5) if x is None else x
    rm, rv = (X(6, seed=5), P(6, seed=6)) if stats else (None, None)
    w = P(6) if w is True else w
    return L.F.ghost_batch_norm(x, 8, rm, rv, w, P(6, seed=2), training, momentum, eps), rm, rv


for name, fn in (("batch_renorm", _renorm), ("ghost_batch_norm", _ghost)):
    for k in ("0", "inf", "nan", "-1e-5", "int 1"):
        row(f"{name} eps={k}", lambda L, fn=fn, e=EPS[k]: fn(L, eps=e))
    row(f"{name} eval eps=0", lambda L, fn=fn: fn(L, training=False, eps=0.0))
    for k, m in {"0": 0.0, "1": 1.0, "-0.1": -0.1, "1.5": 1.5, "nan": nan}.items():
        row(f"{name} momentum={k}", lambda L, fn=fn, m=m: fn(L, momentum=m))
    row(f"{name} weight wrong", lambda L, fn=fn: fn(L, w=P(5)))
    row(f"{name} weight broadcast", lambda L, fn=fn: fn(L, w=P(1)))
    row(f"{name} one value per channel", lambda L, fn=fn: fn(L, x=X(1, 6)))
    row(f"{name} bf16 x f32 params", lambda L, fn=fn: fn(L, x=X(4, 6, 5, dtype=BF16)))
    row(f"{name} int input", lambda L, fn=fn: fn(L, x=torch.ones(4, 6, 5, dtype=torch.int64)))
    row(f"{name} channels_last", lambda L, fn=fn: fn(L, x=X(2, 6, 3, 3, fmt=CL)))
row("ghost_batch_norm no stats", lambda L: _ghost(L, stats=False))


# --- more of the arguments every family shares ---------------------------------
row("batch_norm eps=None", lambda L: _bn(L, eps=None))
row("group_norm eps=None", lambda L: _gn(L, eps=None))
row("instance_norm eps=None", lambda L: _in(L, eps=None))
row("layer_norm2d eps=None", lambda L: L.F.layer_norm2d(X(2, 6, 3, 3), eps=None))
row("add_layer_norm eps=None", lambda L: L.F.add_layer_norm(X(4, 8), X(4, 8, seed=3), (8,), eps=None))
row("group_norm list input", lambda L: L.F.group_norm([[1.0, 2.0]], 1))
row("instance_norm list input", lambda L: L.F.instance_norm([[[1.0, 2.0]]]))
row("layer_norm2d list input", lambda L: L.F.layer_norm2d([[[[1.0]], [[2.0]]]]))
row("add_layer_norm list residual", lambda L: L.F.add_layer_norm(X(1, 2), [[1.0, 2.0]], (2,)))
row("instance_norm momentum=None", lambda L: _in(L, stats=True, momentum=None))
row("ghost_batch_norm momentum=None", lambda L: _ghost(L, momentum=None))
row("ghost_batch_norm no stats momentum=None", lambda L: _ghost(L, stats=False, momentum=None))
row("batch_norm f32 x bf16 weight", lambda L: _bn(L, w=P(6, BF16)))
row("batch_norm f16 x f16 params", lambda L: _bn(L, x=X(4, 6, 5, dtype=F16), rm=Z(6, F16), rv=O(6, F16), w=P(6, F16),
                                                  b=P(6, F16)))
row("group_norm f16 x f32 weight", lambda L: _gn(L, x=X(4, 6, 5, dtype=F16)))
row("group_norm f32 x bf16 weight", lambda L: _gn(L, w=P(6, BF16), b=False))
row("instance_norm f16 x f32 stats", lambda L: _in(L, x=X(4, 6, 5, dtype=F16), stats=True, use_input_stats=False))
row("layer_norm requires_grad", lambda L: L.F.layer_norm(X(4, 8).requires_grad_(), (8,), P(8).requires_grad_()))
row("batch_norm running stats requiring grad", lambda L: _bn(L, rm=Z(6).requires_grad_(), rv=O(6)))


# --- modules: constructor arguments and forward inputs ------------------------
for k, e in EPS.items():
    row(f"LayerNorm eps={k}", lambda L, e=e: fwd(L.nn.LayerNorm(8, eps=e), X(4, 8)))
    row(f"RMSNorm eps={k}", lambda L, e=e: fwd(L.nn.RMSNorm(8, eps=e), X(4, 8)))
    row(f"GroupNorm eps={k}", lambda L, e=e: fwd(L.nn.GroupNorm(3, 6, eps=e), X(4, 6, 5)))
    row(f"BatchNorm1d eps={k}", lambda L, e=e: fwd(L.nn.BatchNorm1d(6, eps=e), X(4, 6, 5)))
    row(f"BatchNorm2d eval eps={k}", lambda L, e=e: fwd(L.nn.BatchNorm2d(6, eps=e), X(2, 6, 3, 3), train=False))
    row(f"InstanceNorm1d eps={k}", lambda L, e=e: fwd(L.nn.InstanceNorm1d(6, eps=e), X(4, 6, 5)))
    row(f"LayerNorm2d eps={k}", lambda L, e=e: fwd(L.nn.LayerNorm2d(6, eps=e), X(2, 6, 3, 3)))
    row(f"FrozenBatchNorm2d eps={k}", lambda L, e=e: fwd(L.nn.FrozenBatchNorm2d(6, eps=e), X(2, 6, 3, 3)))
    row(f"BatchRenorm1d eps={k}", lambda L, e=e: fwd(L.nn.BatchRenorm1d(6, eps=e, r_max=1.0, d_max=0.0), X(4, 6)))
    row(f"GhostBatchNorm1d eps={k}", lambda L, e=e: fwd(L.nn.GhostBatchNorm1d(6, 8, eps=e), X(4, 6)))
row("RMSNorm eps=None", lambda L: fwd(L.nn.RMSNorm(8, eps=None), X(4, 8)))
row("LayerNorm eps=None", lambda L: fwd(L.nn.LayerNorm(8, eps=None), X(4, 8)))
for k, m in {"0": 0.0, "1": 1.0, "None": None, "-0.1": -0.1, "1.5": 1.5, "nan": nan, "int 0": 0, "bool": True,
             "str": "0.1"}.items():
    row(f"BatchNorm1d momentum={k}", lambda L, m=m: fwd(L.nn.BatchNorm1d(6, momentum=m), X(4, 6), steps=2))
    row(f"InstanceNorm1d momentum={k}", lambda L, m=m: fwd(L.nn.InstanceNorm1d(6, momentum=m,
                                                                                track_running_stats=True), X(4, 6, 5)))
    row(f"BatchRenorm1d momentum={k}",
        lambda L, m=m: fwd(L.nn.BatchRenorm1d(6, momentum=m, r_max=1.0, d_max=0.0), X(4, 6), steps=2))
    row(f"GhostBatchNorm1d momentum={k}", lambda L, m=m: fwd(L.nn.GhostBatchNorm1d(6, 8, momentum=m), X(4, 6),
                                                             steps=2))
row("BatchNorm1d momentum=1.5 no tracking",
    lambda L: fwd(L.nn.BatchNorm1d(6, momentum=1.5, track_running_stats=False), X(4, 6)))
row("InstanceNorm1d momentum=None no tracking", lambda L: fwd(L.nn.InstanceNorm1d(6, momentum=None), X(4, 6, 5)))
for k, g in {"0": 0, "-3": -3, "4": 4, "bool": True, "float": 3.0, "numpy": np.int64(3), "swapped": 12}.items():
    row(f"GroupNorm num_groups={k}", lambda L, g=g: fwd(L.nn.GroupNorm(g, 6), X(4, 6, 5)))
row("GroupNorm channels=0", lambda L: fwd(L.nn.GroupNorm(2, 0), X(4, 0, 5)))
row("GroupNorm one value per group", lambda L: fwd(L.nn.GroupNorm(6, 6), X(1, 6)))
row("GroupNorm forward channels wrong", lambda L: fwd(L.nn.GroupNorm(3, 6), X(4, 3, 5)))
row("GroupNorm bf16 input", lambda L: fwd(L.nn.GroupNorm(3, 6), X(4, 6, 5, dtype=BF16)))
row("GroupNorm f64 input", lambda L: fwd(L.nn.GroupNorm(3, 6), X(4, 6, 5, dtype=F64)))
row("LayerNorm shape empty", lambda L: fwd(L.nn.LayerNorm(()), X(4, 8)))
row("LayerNorm shape negative", lambda L: fwd(L.nn.LayerNorm(-8), X(4, 8)))
row("LayerNorm shape 0", lambda L: fwd(L.nn.LayerNorm(0), X(4, 0)))
row("LayerNorm forward shape wrong", lambda L: fwd(L.nn.LayerNorm(8), X(4, 7)))
row("LayerNorm forward 0 rows", lambda L: fwd(L.nn.LayerNorm(8), X(0, 8)))
row("LayerNorm forward bf16 input", lambda L: fwd(L.nn.LayerNorm(8), X(4, 8, dtype=BF16)))
row("LayerNorm forward f64 input", lambda L: fwd(L.nn.LayerNorm(8), X(4, 8, dtype=F64)))
row("LayerNorm forward int input", lambda L: fwd(L.nn.LayerNorm(8), torch.ones(4, 8, dtype=torch.int64)))
row("LayerNorm forward list input", lambda L: fwd(L.nn.LayerNorm(2), [[1.0, 2.0]]))
row("LayerNorm forward non-contiguous", lambda L: fwd(L.nn.LayerNorm(8), X(8, 4).t()))
row("LayerNorm forward channels_last", lambda L: fwd(L.nn.LayerNorm(4), X(2, 3, 4, 4, fmt=CL)))
row("LayerNorm no affine eps=inf", lambda L: fwd(L.nn.LayerNorm(8, eps=inf, elementwise_affine=False), X(4, 8)))
row("LayerNorm no bias eps=inf", lambda L: fwd(L.nn.LayerNorm(8, eps=inf, bias=False), X(4, 8)))
row("RMSNorm forward bf16 input", lambda L: fwd(L.nn.RMSNorm(8), X(4, 8, dtype=BF16)))
row("RMSNorm forward f64 input", lambda L: fwd(L.nn.RMSNorm(8), X(4, 8, dtype=F64)))
row("RMSNorm forward shape wrong", lambda L: fwd(L.nn.RMSNorm((2, 8)), X(4, 8)))
row("RMSNorm shape empty", lambda L: fwd(L.nn.RMSNorm(()), X(4, 8)))
row("BatchNorm1d one value per channel", lambda L: fwd(L.nn.BatchNorm1d(6), X(1, 6)))
row("BatchNorm1d one value per channel eval", lambda L: fwd(L.nn.BatchNorm1d(6), X(1, 6), train=False))
row("BatchNorm2d one value per channel", lambda L: fwd(L.nn.BatchNorm2d(6), X(1, 6, 1, 1)))
row("BatchNorm1d 0 batch", lambda L: fwd(L.nn.BatchNorm1d(6), X(0, 6)))
row("BatchNorm1d forward channels wrong", lambda L: fwd(L.nn.BatchNorm1d(6), X(4, 5)))
row("BatchNorm1d no affine channels wrong", lambda L: fwd(L.nn.BatchNorm1d(6, affine=False, track_running_stats=False),
                                                          X(4, 5)))
row("BatchNorm1d 4-D input", lambda L: fwd(L.nn.BatchNorm1d(6), X(2, 6, 3, 3)))
row("BatchNorm2d 3-D input", lambda L: fwd(L.nn.BatchNorm2d(6), X(2, 6, 3)))
row("BatchNorm3d valid", lambda L: fwd(L.nn.BatchNorm3d(6), X(2, 6, 2, 2, 2), steps=2))
row("BatchNorm3d channels_last_3d", lambda L: fwd(L.nn.BatchNorm3d(6), X(2, 6, 2, 2, 2, fmt=CL3)))
row("BatchNorm2d channels_last", lambda L: fwd(L.nn.BatchNorm2d(6), X(2, 6, 3, 3, fmt=CL), steps=2))
row("BatchNorm2d non-contiguous", lambda L: fwd(L.nn.BatchNorm2d(6), X(3, 3, 6, 2).permute(3, 2, 1, 0)))
row("BatchNorm2d bf16 input", lambda L: fwd(L.nn.BatchNorm2d(6), X(2, 6, 3, 3, dtype=BF16)))
row("BatchNorm2d f64 input", lambda L: fwd(L.nn.BatchNorm2d(6), X(2, 6, 3, 3, dtype=F64)))
row("BatchNorm2d int input", lambda L: fwd(L.nn.BatchNorm2d(6), torch.ones(2, 6, 3, 3, dtype=torch.int64)))
row("BatchNorm1d no tracking eval", lambda L: fwd(L.nn.BatchNorm1d(6, track_running_stats=False), X(4, 6),
                                                  train=False))
row("BatchNorm1d num_features bool", lambda L: fwd(L.nn.BatchNorm1d(True), X(4, 1)))
row("BatchNorm1d num_features negative", lambda L: fwd(L.nn.BatchNorm1d(-1), X(4, 1)))
row("InstanceNorm1d one spatial value", lambda L: fwd(L.nn.InstanceNorm1d(6), X(4, 6, 1)))
row("InstanceNorm1d unbatched", lambda L: fwd(L.nn.InstanceNorm1d(6), X(6, 5)))
row("InstanceNorm1d 4-D input", lambda L: fwd(L.nn.InstanceNorm1d(6), X(2, 6, 3, 3)))
row("InstanceNorm2d affine", lambda L: fwd(L.nn.InstanceNorm2d(6, affine=True), X(2, 6, 3, 3)))
row("InstanceNorm2d affine channels wrong", lambda L: fwd(L.nn.InstanceNorm2d(6, affine=True), X(2, 5, 3, 3)))
row("InstanceNorm2d channels_last", lambda L: fwd(L.nn.InstanceNorm2d(6, affine=True), X(2, 6, 3, 3, fmt=CL)))
row("InstanceNorm3d tracking eval", lambda L: fwd(L.nn.InstanceNorm3d(6, track_running_stats=True),
                                                  X(2, 6, 2, 2, 2), train=False))
row("InstanceNorm3d tracking train", lambda L: fwd(L.nn.InstanceNorm3d(6, track_running_stats=True),
                                                   X(2, 6, 2, 2, 2), steps=2))
row("InstanceNorm2d eval eps=0", lambda L: fwd(L.nn.InstanceNorm2d(6, eps=0.0, track_running_stats=True),
                                               X(2, 6, 3, 3), train=False))
row("LayerNorm2d valid", lambda L: fwd(L.nn.LayerNorm2d(6), X(2, 6, 3, 3)))
row("LayerNorm2d channels_last", lambda L: fwd(L.nn.LayerNorm2d(6), X(2, 6, 3, 3, fmt=CL)))
row("LayerNorm2d channels wrong", lambda L: fwd(L.nn.LayerNorm2d(6), X(2, 5, 3, 3)))
row("FrozenBatchNorm2d train", lambda L: fwd(L.nn.FrozenBatchNorm2d(6), X(2, 6, 3, 3), train=True))
row("FrozenBatchNorm2d one value per channel", lambda L: fwd(L.nn.FrozenBatchNorm2d(6), X(1, 6, 1, 1), train=True))
row("BatchRenorm1d one value per channel", lambda L: fwd(L.nn.BatchRenorm1d(6, r_max=1.0, d_max=0.0), X(1, 6)))
row("BatchRenorm2d channels_last", lambda L: fwd(L.nn.BatchRenorm2d(6, r_max=1.0, d_max=0.0), X(2, 6, 3, 3, fmt=CL)))
row("GhostBatchNorm1d one value per channel", lambda L: fwd(L.nn.GhostBatchNorm1d(6, 8), X(1, 6)))
row("GhostBatchNorm2d channels_last", lambda L: fwd(L.nn.GhostBatchNorm2d(6, 8), X(2, 6, 3, 3, fmt=CL), steps=2))
row("SyncBatchNorm eval", lambda L: fwd(L.nn.SyncBatchNorm(6), X(2, 6, 3, 3), train=False))
row("SyncBatchNorm eval eps=inf", lambda L: fwd(L.nn.SyncBatchNorm(6, eps=inf), X(2, 6, 3, 3), train=False))

# local response normalization: size, alpha/beta/k edges, ranks; CrossMapLRN2d


def _lrn(L, x=None, size=3, alpha=1e-2, beta=0.75, k=1.0):
    return L.F.local_response_norm(X(2, 6, 4) if x is None else x, size, alpha, beta, k)


row("local_response_norm valid", lambda L: _lrn(L))
row("local_response_norm 4-D even size", lambda L: _lrn(L, X(2, 6, 3, 3), size=4))
row("local_response_norm 5-D", lambda L: _lrn(L, X(2, 6, 2, 2, 3), size=5))
row("local_response_norm 6-D", lambda L: _lrn(L, X(1, 6, 2, 2, 1, 2), size=2))
row("local_response_norm size > C", lambda L: _lrn(L, size=9))
row("local_response_norm size 1", lambda L: _lrn(L, size=1))
row("local_response_norm size 0", lambda L: _lrn(L, size=0))
row("local_response_norm size negative", lambda L: _lrn(L, size=-2))
row("local_response_norm size float", lambda L: _lrn(L, size=2.5))
row("local_response_norm size bool", lambda L: _lrn(L, size=True))
row("local_response_norm alpha 0", lambda L: _lrn(L, alpha=0.0))
row("local_response_norm alpha negative", lambda L: _lrn(L, alpha=-1.0))
row("local_response_norm alpha nan", lambda L: _lrn(L, alpha=nan))
row("local_response_norm alpha int", lambda L: _lrn(L, alpha=1))
row("local_response_norm beta 0", lambda L: _lrn(L, beta=0.0))
row("local_response_norm beta negative", lambda L: _lrn(L, beta=-0.5))
row("local_response_norm k 0", lambda L: _lrn(L, k=0.0))
row("local_response_norm k negative", lambda L: _lrn(L, k=-1.0))
row("local_response_norm k inf", lambda L: _lrn(L, k=inf))
row("local_response_norm 2-D input", lambda L: _lrn(L, X(4, 6)))
row("local_response_norm f64", lambda L: _lrn(L, X(2, 6, 4, dtype=F64)))
row("local_response_norm int input", lambda L: _lrn(L, torch.ones(2, 6, 4, dtype=torch.int64)))
row("LocalResponseNorm valid", lambda L: fwd(L.nn.LocalResponseNorm(2), X(2, 6, 3, 3)))
row("LocalResponseNorm size 0", lambda L: fwd(L.nn.LocalResponseNorm(0), X(2, 6, 3, 3)))
row("CrossMapLRN2d valid", lambda L: fwd(L.nn.CrossMapLRN2d(3, 0.5), X(2, 6, 3, 3)))
row("CrossMapLRN2d even size", lambda L: fwd(L.nn.CrossMapLRN2d(4, 0.5), X(2, 7, 2, 2)))
row("CrossMapLRN2d 3-D input", lambda L: fwd(L.nn.CrossMapLRN2d(3), X(2, 6, 3)))
row("CrossMapLRN2d size 0", lambda L: fwd(L.nn.CrossMapLRN2d(0), X(2, 6, 3, 3)))
row("CrossMapLRN2d size negative", lambda L: fwd(L.nn.CrossMapLRN2d(-1), X(2, 6, 3, 3)))


# the Lazy modules: the first call, then a second of another channel count


def _lazy(L, name, first, second=None, **kwargs):
    m = getattr(L.nn, name)(**kwargs)
    out = fwd(m, first)
    return out if second is None else fwd(m, second)


row("LazyBatchNorm1d valid", lambda L: _lazy(L, "LazyBatchNorm1d", X(4, 6), X(4, 6, seed=1)))
row("LazyBatchNorm2d channels changed", lambda L: _lazy(L, "LazyBatchNorm2d", X(2, 6, 3, 3), X(2, 5, 3, 3)))
row("LazyBatchNorm3d wrong rank first", lambda L: _lazy(L, "LazyBatchNorm3d", X(2, 6, 3, 3)))
row("LazyBatchNorm1d no state channels changed",
    lambda L: _lazy(L, "LazyBatchNorm1d", X(4, 6), X(4, 5), affine=False, track_running_stats=False))
row("LazyInstanceNorm2d valid", lambda L: _lazy(L, "LazyInstanceNorm2d", X(2, 6, 3, 3), X(2, 6, 3, 3, seed=2)))
row("LazyInstanceNorm1d channels changed", lambda L: _lazy(L, "LazyInstanceNorm1d", X(2, 6, 4), X(2, 5, 4)))
row("LazyInstanceNorm3d momentum=1.5", lambda L: _lazy(L, "LazyInstanceNorm3d", X(2, 6, 2, 2, 2), momentum=1.5))
# --- norm + activation (the oracle: the norm, then torch's activation; timm's classes) -------------
row("batch_norm_act train silu", lambda L: L.F.batch_norm_act(X(4, 6, 3), Z(6), O(6), P(6), P(6, seed=2), True,
                                                              act="silu"))
row("batch_norm_act eval relu", lambda L: L.F.batch_norm_act(X(4, 6, 3), P(6, seed=3) - 1, P(6), P(6), None))
row("batch_norm_act channels_last leaky", lambda L: L.F.batch_norm_act(X(2, 6, 3, 3, fmt=CL), None, None, P(6), None,
                                                                       True, act="leaky_relu", negative_slope=0.2))
row("batch_norm_act bf16 x f32 weight gelu", lambda L: L.F.batch_norm_act(X(4, 6, 3, dtype=BF16), None, None, P(6),
                                                                          P(6, seed=2), True, act="gelu"))
row("batch_norm_act weight wrong", lambda L: L.F.batch_norm_act(X(4, 6, 3), None, None, P(5), None, True))
row("batch_norm_act one value per channel", lambda L: L.F.batch_norm_act(X(1, 6), None, None, training=True))
row("batch_norm_act eval no running", lambda L: L.F.batch_norm_act(X(4, 6, 3), None, None, training=False))
row("batch_norm_act act unknown", lambda L: L.F.batch_norm_act(X(4, 6, 3), None, None, training=True, act="mish"))
row("group_norm_act gelu_tanh", lambda L: L.F.group_norm_act(X(2, 6, 5), 3, P(6), P(6, seed=2), act="gelu_tanh"))
row("group_norm_act channels_last hardswish", lambda L: L.F.group_norm_act(X(2, 6, 3, 3, fmt=CL), 2, act="hardswish"))
row("group_norm_act indivisible", lambda L: L.F.group_norm_act(X(2, 6, 5), 4))
row("layer_norm_act tanh", lambda L: L.F.layer_norm_act(X(4, 8), (8,), P(8), P(8, seed=2), act="tanh"))
row("layer_norm_act shape wrong", lambda L: L.F.layer_norm_act(X(4, 8), (7,)))
row("layer_norm_act2d channels_last silu", lambda L: L.F.layer_norm_act2d(X(2, 6, 3, 3, fmt=CL), P(6), P(6), act="silu"))
row("BatchNormAct2d train silu", lambda L: fwd(L.nn.BatchNormAct2d(6, act_layer="silu"), X(2, 6, 3, 3), steps=2))
row("BatchNormAct2d eval leaky", lambda L: fwd(L.nn.BatchNormAct2d(6, act_layer="leaky_relu"), X(2, 6, 3, 3),
                                                train=False))
row("BatchNormAct2d channels_last momentum None", lambda L: fwd(L.nn.BatchNormAct2d(6, momentum=None),
                                                                 X(2, 6, 3, 3, fmt=CL), steps=2))
row("BatchNormAct2d no act", lambda L: fwd(L.nn.BatchNormAct2d(6, apply_act=False), X(2, 6, 3, 3)))
row("FrozenBatchNormAct2d gelu", lambda L: fwd(L.nn.FrozenBatchNormAct2d(6, act_layer="gelu"), X(2, 6, 3, 3)))
row("GroupNormAct silu", lambda L: fwd(L.nn.GroupNormAct(6, 3, act_layer="silu"), X(2, 6, 3, 3)))
row("LayerNormAct tanh", lambda L: fwd(L.nn.LayerNormAct(6, act_layer="tanh"), X(3, 4, 6)))
row("LayerNormAct2d channels_last", lambda L: fwd(L.nn.LayerNormAct2d(6), X(2, 6, 3, 3, fmt=CL)))


# ----------------------------------------------------------------------------
# where normlab differs from torch on purpose
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Deliberate:
    rows: str  # the rows it covers: a regular expression matching whole row ids
    why: str
    exc: type | None  # the class normlab raises; None: normlab accepts where torch refuses
    message: str = ""  # what normlab's message says (re.search)


_EPS_MSG = r"expected eps (to be a non-negative number|> 0 in training), got "
DELIBERATE: dict[str, Deliberate] = {
    "LRN integer input": Deliberate(
        r"local_response_norm int input", "an integer input is refused as by every normlab entry (torch's "
        "LRN computes it through its pooling ops); convert it first", NotImplementedError,
        r"expected a floating-point input"),
    "CrossMapLRN2d size < 1": Deliberate(
        r"CrossMapLRN2d size (0|negative)", "a window of no channel: torch divides by zero (ZeroDivisionError) "
        "for 0 and computes with a negative size; normlab refuses both at construction, with "
        "LocalResponseNorm's RuntimeError", RuntimeError, r"expected size >= 1"),
    "eps NaN": Deliberate(
        r".* eps=nan", "a NaN eps makes every output NaN (torch computes them); a caller's bug, refused before "
        "any work (batch_norm in training says 'expected eps > 0 in training', its own check, which runs first)",
        ValueError, _EPS_MSG + "nan"),
    "eps negative": Deliberate(
        r"(?!batch|Batch|ghost|Ghost|Frozen).* eps=-1e-5", "var + eps < 0 gives NaN for a row/group of small "
        "variance (torch computes it; its batch_norm refuses a negative eps too: those rows meet torch's "
        "ValueError)", ValueError, _EPS_MSG + r"-1e-05"),
    "eps bool": Deliberate(
        r".* eps=bool", "torch takes True as eps=1.0; a bool there is a flag passed by position "
        "(LayerNorm(8, False) is eps=0, not elementwise_affine=False)", TypeError,
        r"expected eps to be a float( or None)?, got True; a bool here is usually a flag passed by position"),
    "momentum outside [0, 1]": Deliberate(
        r".* momentum=(-0\.1|1\.5|nan)( .*)?", "torch extrapolates the running statistics (or makes them NaN); "
        "refused whether or not the call updates them (eval, no running statistics): one judgement of the value",
        ValueError, r"expected momentum in \[0, 1\] \(the weight of the new batch statistic in the running ones"
        r"(; None: a cumulative average)?\), got (-0\.1|1\.5|nan)$"),
    "momentum bool": Deliberate(
        r".* momentum=bool", "torch takes True as momentum=1.0; a bool there is a flag passed by position",
        TypeError, r"expected momentum to be a float in \[0, 1\]( or None)?, got True$"),
    "num_groups <= 0": Deliberate(
        r"(group_norm|GroupNorm) num_groups=(0|-3)", "torch raises ZeroDivisionError (0) or, at the first "
        "forward, RuntimeError (negative); normlab one ValueError for both, at construction",
        ValueError, r"expected num_groups to be a positive int, got (0|-3)$"),
    "residual broadcast": Deliberate(
        r"add_(layer|rms)_norm residual broadcast", "the fused add reads x and residual elementwise: nothing is "
        "broadcast (x + residual would be)", RuntimeError, r"residual is added elementwise, without broadcasting$"),
    "residual dtype": Deliberate(
        r"add_layer_norm residual (f64|int)", "the fused add writes h in x's dtype: no type promotion "
        "(x + residual would promote)", RuntimeError, r"expected residual of the input's dtype torch.float32, got "),
    "non-tensor input": Deliberate(
        r"(batch_norm|group_norm|instance_norm|layer_norm2d) list input", "torch fails inside with AttributeError "
        "('list' object has no attribute 'size'/'dim'); normlab names the type", TypeError,
        r"expected input to be a torch.Tensor, got list$"),
    "ghost momentum=None": Deliberate(
        r"ghost_batch_norm momentum=None", "momentum=None is GhostBatchNorm's cumulative average, which needs "
        "num_batches_tracked (the modules pass it); torch's batch_norm takes no None", ValueError,
        r"momentum=None \(the cumulative average\) needs num_batches_tracked"),
    "ghost momentum=None unused": Deliberate(
        r"ghost_batch_norm no stats momentum=None", "without running statistics the momentum is never used; "
        "None is ghost_batch_norm's documented cumulative average", None),
    "int normalized_shape": Deliberate(
        r"(layer|rms)_norm shape int", "normlab.functional takes an int normalized_shape as (n,), as torch.nn's "
        "constructors do (torch.nn.functional refuses it)", None),
    "0 channels in training": Deliberate(
        r"batch_norm 0 channels", "torch's kernel fails with IndexError from select() on the empty statistics; "
        "normlab returns the empty output", None),
    "per-channel tensors of two dtypes": Deliberate(
        r"batch_norm bf16 x f32 weight bf16 stats", "each per-channel tensor may be float32 or the input's "
        "dtype on its own (the result is torch's with every one of them in float32); torch's CPU kernel wants "
        "them all float32 or all bfloat16. Refusing it would need _C.batch_norm_fast to refuse it too", None),
}

# rows that wait for a change in a file this table's author could not edit: row id -> the change.
# The row is run and must still fail (a row that passes is a stale entry).
PENDING: dict[str, str] = {
}

# rows where normlab's output has zeros of the other sign than torch's: (row, backend) -> why
ZERO_SIGNS: dict[tuple[str, str], str] = {}


def _deliberate(row_id):
    hits = [k for k, d in DELIBERATE.items() if re.fullmatch(d.rows, row_id)]
    assert len(hits) <= 1, (row_id, hits)
    return DELIBERATE[hits[0]] if hits else None


# ----------------------------------------------------------------------------
# the test
# ----------------------------------------------------------------------------


def _outcome(run):
    """``("ok", tensors)`` or ``("raise", exception)``, warnings silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            out = run()
        except Exception as e:  # noqa: BLE001 - the exception is the verdict
            return "raise", e
    out = out if isinstance(out, tuple) else (out,)
    return "ok", [None if t is None else t.detach() for t in _flat(out)]


def _flat(out):
    for t in out:
        if isinstance(t, tuple):
            yield from _flat(t)
        else:
            yield t


def _ours(row_, backend):
    with normlab.use_backend(backend):
        return _outcome(lambda: row_.run(NORMLAB))


def _describe(outcome):
    return f"{type(outcome[1]).__name__}: {outcome[1]}" if outcome[0] == "raise" else "accepted"


_TOL = {F16: {"rtol": 2e-3, "atol": 2e-3}, BF16: {"rtol": 1.6e-2, "atol": 1.6e-2}}


def _assert_same_values(got, want, what):
    assert len(got) == len(want), what
    signs = []
    for i, (a, b) in enumerate(zip(got, want)):
        assert (a is None) == (b is None), (what, i)
        if a is None:
            continue
        assert a.dtype == b.dtype and a.shape == b.shape, (what, i, a.dtype, b.dtype, a.shape, b.shape)
        tol = _TOL.get(b.dtype, {})  # half precision: torch's kernels round differently (an ulp or two)
        torch.testing.assert_close(a, b, equal_nan=True, msg=lambda m: f"{what}, output {i}: {m}", **tol)
        zeros = (a == 0) & (b == 0)
        if bool((torch.signbit(a) != torch.signbit(b))[zeros].any()):
            signs.append(i)
    return signs


def _check_row(r):
    ref, cpu = _ours(r, "ref"), _ours(r, "cpu")
    theirs = _outcome(lambda: r.run(TORCH))
    # one judgement: the backends agree
    assert ref[0] == cpu[0], f"ref: {_describe(ref)}; cpu: {_describe(cpu)}"
    if ref[0] == "raise":
        assert (type(ref[1]), str(ref[1])) == (type(cpu[1]), str(cpu[1])), (
            f"ref: {_describe(ref)}; cpu: {_describe(cpu)}")
    else:
        _assert_same_values(cpu[1], ref[1], "cpu against ref")
    d = _deliberate(r.id)
    if d is not None and d.exc is None:  # normlab accepts where torch refuses
        assert ref[0] == "ok", f"DELIBERATE says normlab accepts ({d.why}), but: {_describe(ref)}"
        assert theirs[0] == "raise", "stale DELIBERATE entry: torch accepts too"
        return
    if d is not None:
        assert ref[0] == "raise", f"DELIBERATE says normlab refuses ({d.why}), but it accepts"
        assert type(ref[1]) is d.exc and re.search(d.message, str(ref[1])), _describe(ref)
        assert not (theirs[0] == "raise" and isinstance(ref[1], type(theirs[1]))), (
            f"stale DELIBERATE entry: torch refuses the same way ({_describe(theirs)})")
        return
    # against torch
    assert ref[0] == theirs[0], f"normlab: {_describe(ref)}; torch: {_describe(theirs)}"
    if theirs[0] == "raise":
        assert isinstance(ref[1], type(theirs[1])), f"normlab: {_describe(ref)}; torch: {_describe(theirs)}"
        return
    for backend, ours in (("ref", ref), ("cpu", cpu)):
        signs = _assert_same_values(ours[1], theirs[1], f"{backend} against torch")
        if signs and (r.id, backend) not in ZERO_SIGNS:
            pytest.fail(f"{backend}: zeros of the other sign than torch's in output(s) {signs}")
        if signs:
            warnings.warn(f"{r.id} ({backend}): zeros of the other sign than torch's: {ZERO_SIGNS[r.id, backend]}")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny tensors: one thread (two xdist workers' thread pools spinning on two shared cores cost more
    than every row's arithmetic)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("r", ROWS, ids=[r.id for r in ROWS])
def test_argument_table(r):
    if r.id not in PENDING:
        _check_row(r)
        return
    try:
        _check_row(r)
    except AssertionError:
        pytest.xfail(f"pending: {PENDING[r.id]}")
    pytest.fail(f"stale PENDING entry: the row passes now ({PENDING[r.id]})")


def test_the_table():
    """At least 60 rows; every DELIBERATE, PENDING and ZERO_SIGNS entry names rows of the table."""
    ids = {r.id for r in ROWS}
    assert len(ids) >= 60
    for name, d in DELIBERATE.items():
        assert any(re.fullmatch(d.rows, i) for i in ids), name
    assert set(PENDING) <= ids and {r for r, _ in ZERO_SIGNS} <= ids
