"""The fast argument tests of ``normlab.functional`` never change what is accepted.

Each function first runs a cheap test of its arguments and runs the full
checks (which raise the error that names the problem) only when that test
fails. The oracle here is the function itself with the fast test switched off.
Each example is a valid call with at most one flaw (a wrong shape, dtype,
device or type, a NaN or negative eps, a bad momentum or num_groups, a group
or channel of one value, ...): with the fast test on and off the function
must raise the same exception with the same message, or return the same
values. A fast test that let a flaw through would make the two differ.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import normlab
import normlab.functional as NF

DTYPES = st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16])

# flaws of a parameter (weight, bias, running statistic) and of the scalars, shared by every op
PARAM_FLAWS = ["short", "2d", "dtype", "int", "meta", "list"]
EPS_FLAWS = {"eps<0": -1.0, "eps nan": math.nan, "eps str": "1e-5", "eps bool": True}
# values the full checks accept that the fast tests do not (the slow path must give the same result)
EPS_SLOW = {"eps int": 1, "eps numpy": np.float64(1e-3), "eps inf": math.inf, "eps 0": 0.0}


def _tensor(shape, dtype, device="cpu"):
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=torch.float64).to(dtype).to(device)
    return torch.randint(-3, 4, shape, dtype=dtype, device=device)


def _param(shape, dtype, flaw=None, low_precision_float32=False):
    """A parameter of ``shape`` for an input of ``dtype`` (positive: it may be a variance), with ``flaw``."""
    if flaw == "list":
        return [1.0] * shape[0]
    pdtype = torch.float32 if low_precision_float32 and dtype in (torch.bfloat16, torch.float16) else dtype
    if flaw == "short":
        shape = (shape[0] + 1,)
    elif flaw == "2d":
        shape = (*shape, 1)
    elif flaw == "dtype":
        pdtype = torch.float64 if dtype != torch.float64 else torch.float32
    elif flaw == "int":
        return torch.ones(shape, dtype=torch.int64)
    if flaw == "meta":
        return torch.ones(shape, dtype=pdtype, device="meta")
    return _tensor(shape, pdtype).abs() + 0.5


def _outcome(fn, make_args):
    """What ``fn(*args)`` does: ``("ok", outputs)`` or ``("raise", type, message)``."""
    try:
        out = fn(*make_args())
    except Exception as e:  # noqa: BLE001 - the exception itself is what is compared
        return ("raise", type(e), str(e))
    return ("ok", out if isinstance(out, tuple) else (out,))


def _same(fn, make_args, flaw):
    """``fn`` with its fast test on and off does the same thing on ``make_args()``."""
    fast = _outcome(fn, make_args)
    with pytest.MonkeyPatch.context() as m:
        for module in (NF.row_norms, NF.batch_norms, NF.group_norms, NF.checks):
            m.setattr(module, "cpu_params_fit", lambda *a, **k: False)  # every fast test needs it: all off
        slow = _outcome(fn, make_args)
    assert fast[0] == slow[0], (flaw, fast, slow)
    if fast[0] == "raise":
        assert fast[1:] == slow[1:], flaw
    else:
        for a, b in zip(fast[1], slow[1]):
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    return fast[0]


def _eps(flaw, default=1e-5):
    return EPS_FLAWS.get(flaw, EPS_SLOW.get(flaw, default))


ROW_FLAWS = [None, "x int", "x int, no params", "x meta", "x list", "x 0-d", "norm int", "norm list", "norm size", "norm empty",
             "norm float", "norm bool", "norm negative", "norm wrong", "norm too long", "w low-precision float32",
             *(f"w {f}" for f in PARAM_FLAWS), *(f"b {f}" for f in PARAM_FLAWS),
             "residual dtype", "residual shape", "residual list", "residual meta", *EPS_FLAWS, *EPS_SLOW]


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"])
@pytest.mark.parametrize("flaw", ROW_FLAWS)
@settings(max_examples=6, deadline=None)
@given(
    dtype=DTYPES,
    lead=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    last=st.lists(st.integers(1, 4), min_size=1, max_size=2),
)
def test_row_norms_fast_checks_agree_with_full_checks(dtype, lead, last, flaw, op):
    shape, norm = (*lead, *last), tuple(last)
    normalized = {
        "norm int": norm[-1], "norm list": list(norm), "norm size": torch.Size(norm), "norm empty": (),
        "norm float": tuple(float(d) for d in norm), "norm bool": (True,) * len(norm),
        "norm negative": (*norm[:-1], -norm[-1]), "norm wrong": (*norm[:-1], norm[-1] + 1), "norm too long": (7, *shape),
    }.get(flaw, norm)
    pshape = tuple(int(d) for d in normalized) if isinstance(normalized, (tuple, list)) else (int(normalized),)
    if flaw == "norm negative":
        pshape = (1,)  # (w and b are None then)
    if flaw == "norm int":
        normalized, pshape = norm[-1], norm[-1:]
        shape = (*shape, norm[-1]) if len(norm) > 1 else shape

    def make_args():
        torch.manual_seed(1)
        x = {"x int": lambda: _tensor(shape, torch.int64), "x list": lambda: [1.0, 2.0],
             "x 0-d": lambda: torch.tensor(1.0, dtype=dtype),
             "x meta": lambda: torch.empty(shape, dtype=dtype, device="meta"),
             }.get(flaw, lambda: _tensor(shape, dtype))()
        if flaw == "x int, no params":
            x = _tensor(shape, torch.int64)
        w = _param(pshape or (1,), dtype, flaw[2:] if flaw and flaw.startswith("w ") else None,
                   low_precision_float32=flaw == "w low-precision float32")
        b = _param(pshape or (1,), dtype, flaw[2:] if flaw and flaw.startswith("b ") else None)
        if flaw in ("x int, no params", "norm empty", "norm negative"):
            w = b = None
        r = {"residual dtype": lambda: _tensor(shape, torch.float64 if dtype != torch.float64 else torch.float32),
             "residual shape": lambda: _tensor((*shape, 1), dtype), "residual list": lambda: [0.0],
             "residual meta": lambda: torch.empty(shape, dtype=dtype, device="meta"),
             }.get(flaw, lambda: _tensor(shape, dtype))()
        eps = _eps(flaw)
        return {
            "layer_norm": (x, normalized, w, b, eps),
            "rms_norm": (x, normalized, w, eps),
            "add_layer_norm": (x, r, normalized, w, b, eps),
            "add_rms_norm": (x, r, normalized, w, eps),
        }[op]

    outcome = _same(getattr(NF, op), make_args, flaw)
    if flaw is None:
        assert outcome == "ok"


CHANNEL_FLAWS = [None, "x int", "x int, no params", "x meta", "x list", "x 1-d", "w low-precision float32",
                 *(f"w {f}" for f in PARAM_FLAWS), *(f"b {f}" for f in PARAM_FLAWS),
                 *(f"rm {f}" for f in PARAM_FLAWS), *(f"rv {f}" for f in PARAM_FLAWS),
                 "rm none", "rv none", "both none", "momentum nan", "momentum none", "momentum str",
                 "momentum bool", "momentum int", "momentum numpy", "momentum 2", "momentum -0.1", "momentum 0",
                 "one value per channel",
                 *EPS_FLAWS, *EPS_SLOW]


def _channel_args(dtype, shape, flaw):
    """``x, rm, rv, w, b, momentum, eps`` for a per-channel op, with ``flaw``."""
    if flaw == "one value per channel":
        shape = (1, shape[1], *(1,) * (len(shape) - 2))
    x = {"x int": lambda: _tensor(shape, torch.int64), "x list": lambda: [1.0, 2.0],
         "x 1-d": lambda: _tensor(shape[:1], dtype),
         "x meta": lambda: torch.empty(shape, dtype=dtype, device="meta"),
         }.get(flaw, lambda: _tensor(shape, dtype))()
    if flaw == "x int, no params":
        x = _tensor(shape, torch.int64)
        return x, None, None, None, None, 0.1, 1e-5
    c = (shape[1],)

    def p(name):
        f = flaw[len(name) + 1:] if flaw and flaw.startswith(name + " ") else None
        return _param(c, dtype, f, low_precision_float32=flaw == "w low-precision float32" and name == "w")

    rm, rv = p("rm"), p("rv")
    if flaw in ("rm none", "both none"):
        rm = None
    if flaw in ("rv none", "both none"):
        rv = None
    momentum = {"momentum nan": math.nan, "momentum none": None, "momentum str": "0.1", "momentum bool": True,
                "momentum int": 1, "momentum numpy": np.float32(0.5), "momentum 2": 2.0, "momentum -0.1": -0.1,
                "momentum 0": 0.0}.get(flaw, 0.1)
    return x, rm, rv, p("w"), p("b"), momentum, _eps(flaw)


@pytest.mark.parametrize("op", ["batch_norm", "instance_norm"])
@pytest.mark.parametrize("flaw", CHANNEL_FLAWS)
@settings(max_examples=8, deadline=None)
@given(
    dtype=DTYPES,
    shape=st.lists(st.integers(1, 3), min_size=2, max_size=4),
    flag=st.booleans(),
)
def test_batch_and_instance_norm_fast_checks_agree_with_full_checks(op, dtype, shape, flaw, flag):
    """``flag``: batch_norm's ``training``, instance_norm's ``use_input_stats`` (the same
    place in both signatures)."""
    shape = tuple(shape)

    def make_args():  # fresh running statistics each call: both update them in place
        torch.manual_seed(1)
        x, rm, rv, w, b, momentum, eps = _channel_args(dtype, shape, flaw)
        return x, rm, rv, w, b, flag, momentum, eps

    _same(getattr(NF, op), make_args, flaw)


@pytest.mark.parametrize("flaw", CHANNEL_FLAWS + ["groups 0", "groups -1", "groups float", "groups bool",
                                                   "groups numpy", "groups indivisible"])
@settings(max_examples=8, deadline=None)
@given(
    dtype=DTYPES,
    shape=st.lists(st.integers(1, 3), min_size=2, max_size=4),
    per_group=st.integers(1, 2),
)
def test_group_norm_fast_checks_agree_with_full_checks(dtype, shape, flaw, per_group):
    shape = (shape[0], shape[1] * per_group, *shape[2:])
    groups = {"groups 0": 0, "groups -1": -1, "groups float": float(shape[1] // per_group),
              "groups bool": True, "groups numpy": np.int64(shape[1] // per_group),
              "groups indivisible": shape[1] + 1}.get(flaw, shape[1] // per_group)

    def make_args():
        torch.manual_seed(1)
        x, _, _, w, b, _, eps = _channel_args(dtype, shape, flaw)
        return x, groups, w, b, eps

    _same(NF.group_norm, make_args, flaw)


@pytest.mark.parametrize("op", ["layer_norm", "batch_norm", "group_norm"])
@pytest.mark.parametrize("backend", normlab.available_backends())
def test_the_common_call_takes_the_fast_path(op, backend):
    """A module-style call (CPU tensors, fitting parameters, float eps) never runs the full checks
    (the Python functions the call enters, as the profiler hook sees them)."""
    import sys

    x, w = torch.randn(4, 6, 3), torch.ones(6)
    calls = {
        "layer_norm": lambda: NF.layer_norm(x, (3,), torch.ones(3), torch.zeros(3), 1e-5),
        "batch_norm": lambda: NF.batch_norm(x, torch.zeros(6), torch.ones(6), w, w, True, 0.1, 1e-5),
        "group_norm": lambda: NF.group_norm(x, 3, w, w, 1e-5),
    }
    entered = []

    def hook(frame, event, arg):
        if event == "call":
            entered.append(frame.f_code.co_name)

    with normlab.use_backend(backend):
        sys.setprofile(hook)
        try:
            calls[op]()
        finally:
            sys.setprofile(None)
    assert op in entered  # the hook sees the entry itself
    assert "check_input" not in entered


# ----------------------------------------------------------------------------
# what a user is told: the class (torch's for the same mistake) and the message
# ----------------------------------------------------------------------------

_X = torch.randn(2, 4, 3)
_RM, _RV = torch.zeros(4), torch.ones(4)


@pytest.mark.parametrize("call,exc,message,theirs", [
    (lambda: NF.layer_norm(_X, (-3,)), RuntimeError,
     r"^layer_norm: expected normalized_shape of sizes >= 0, got normalized_shape = \[-3\]$",
     lambda: torch.nn.functional.layer_norm(_X, (-3,))),
    (lambda: NF.layer_norm(_X, ()), RuntimeError,
     r"^layer_norm: expected normalized_shape to have at least one dim, got normalized_shape = \[\]$",
     lambda: torch.nn.functional.layer_norm(_X, ())),
    (lambda: NF.rms_norm(_X, (2, -3)), RuntimeError, r"^rms_norm: expected normalized_shape of sizes >= 0", None),
    (lambda: NF.batch_norm(_X, _RM, _RV, training=True, momentum=2.0), ValueError,
     r"^batch_norm: expected momentum in \[0, 1\] \(the weight of the new batch statistic in the running ones\), "
     r"got 2.0$", None),
    (lambda: NF.batch_norm(_X, _RM, _RV, training=True, momentum=-0.1), ValueError,
     r"^batch_norm: expected momentum in \[0, 1\].*got -0.1$", None),
    (lambda: NF.instance_norm(_X, _RM, _RV, momentum=math.nan), ValueError,
     r"^instance_norm: expected momentum in \[0, 1\].*got nan$", None),
    (lambda: NF.batch_norm(_X, _RM, _RV, training=True, momentum="0.1"), TypeError,
     r"^batch_norm: expected momentum to be a float in \[0, 1\], got '0.1'$",
     lambda: torch.nn.functional.batch_norm(_X, _RM, _RV, training=True, momentum="0.1")),
    (lambda: NF.group_norm(_X, 0), ValueError, r"^group_norm: expected num_groups to be a positive int, got 0$", None),
    (lambda: NF.group_norm(_X, 3), RuntimeError,
     r"^group_norm: expected the number of channels \(4, input.shape\[1\] of input shape \[2, 4, 3\]\) to be "
     r"divisible by num_groups \(3\)$", lambda: torch.nn.functional.group_norm(_X, 3)),
    (lambda: NF.ghost_batch_norm(_X, 2.5), TypeError,
     r"^ghost_batch_norm: expected virtual_batch_size to be a positive int \(samples per virtual batch\), got 2.5$",
     None),
    (lambda: NF.ghost_batch_norm(_X, 0), ValueError,
     r"^ghost_batch_norm: expected virtual_batch_size to be a positive int .*got 0$", None),
    (lambda: NF.batch_renorm(_X, _RM, _RV, r_max="3"), TypeError, r"^batch_renorm: expected r_max to be a float, got '3'$",
     None),
    (lambda: NF.batch_renorm(_X, _RM, _RV, d_max=-1.0), ValueError, r"^batch_renorm: expected d_max >= 0 and finite, got -1.0",
     None),
])
def test_functional_argument_errors(call, exc, message, theirs):
    """Each mistake raises ``exc`` (torch's class, where torch catches it: ``theirs``) with the message."""
    if theirs is not None:
        with pytest.raises(exc):
            theirs()
    with pytest.raises(exc, match=message):
        call()


@pytest.mark.parametrize("momentum", [0, 0.0, 1, 1.0, np.float32(0.5)])
def test_momentum_at_the_ends_of_its_range_matches_torch(momentum):
    x = torch.randn(6, 4, 3)
    rm, rv, rm_t, rv_t = torch.zeros(4), torch.ones(4), torch.zeros(4), torch.ones(4)
    y = NF.batch_norm(x, rm, rv, training=True, momentum=momentum)
    y_t = torch.nn.functional.batch_norm(x, rm_t, rv_t, training=True, momentum=float(momentum))
    torch.testing.assert_close(y, y_t, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close((rm, rv), (rm_t, rv_t), rtol=1e-6, atol=1e-6)
