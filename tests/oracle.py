"""Independent oracles shared by the tests: float64 references and error measures."""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch


def saved_bytes_beyond_inputs(fn, *inputs) -> int:
    """Bytes of the tensors autograd saves while ``fn`` runs on the "cpu" backend that are not the
    inputs' own storage (torch's saved-tensor hooks: whatever the tensors are)."""
    import normlab

    kept = []
    with normlab.use_backend("cpu"), torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t,
                                                                                lambda t: t):
        fn()
    own = {t.untyped_storage().data_ptr() for t in inputs}
    return sum(t.numel() * t.element_size() for t in kept if t.untyped_storage().data_ptr() not in own)


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative error in the Frobenius norm, computed in float64."""
    got, ref = got.double(), ref.double()
    return ((got - ref).norm() / ref.norm()).item()


def rounding_err(ref: torch.Tensor, dtype: torch.dtype) -> float:
    """The error of rounding a float64 result to ``dtype``: the best any kernel can do."""
    return rel_err(ref.to(dtype), ref)


def assert_accurate_vs_unfused(got, unfused, ref64, what):
    """``got``'s error against the float64 result is at most twice that of torch's own ops in the
    same dtype (``unfused``: the reference path, unfused torch ops), or of rounding the result to
    the dtype, whichever is larger (the design's rule). For float64 input the oracle is float64
    itself (torch's own error reads 0): a floor of 2 float64 roundings."""
    dt = got.dtype
    floor = torch.finfo(dt).eps * (2 if dt == torch.float64 else 1)
    bound = 2 * max(rel_err(unfused, ref64), rounding_err(ref64, dt), floor)
    err = rel_err(got, ref64)
    assert err <= bound, f"{what}: relative error {err:.3e} > 2 x torch's own / rounding ({bound / 2:.3e})"


def assert_within_rounding(
    got: torch.Tensor, ref: torch.Tensor, factor: float = 2.0, what: str = "", dtype: torch.dtype | None = None
) -> None:
    """``got`` is within ``factor`` x the error of rounding the float64 ``ref`` to ``dtype``
    (``got``'s own dtype unless given)."""
    dtype = got.dtype if dtype is None else dtype
    bound = factor * rounding_err(ref, dtype)
    err = rel_err(got, ref)
    assert err <= bound, f"{what}: relative error {err:.3e} > {factor} x rounding error to {dtype} ({bound:.3e})"


HALF = (torch.bfloat16, torch.float16)


def leaf(t: torch.Tensor | None) -> torch.Tensor | None:
    """A fresh leaf copy of ``t`` that requires grad (None stays None)."""
    return None if t is None else t.detach().clone().requires_grad_()


def affine_params(shape, affine: str, dtype=torch.float64, requires_grad: bool = False, seed: int = 0):
    """(weight, bias) of ``shape`` for a norm layer: weight about 1 (+- 0.5), bias about 0 (+- 1),
    drawn in float64 from ``seed``; ``affine`` is "both", "weight" (bias None) or "none"."""
    if affine == "none":
        return None, None
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(shape, generator=g, dtype=torch.float64) * 0.5 + 1).to(dtype)
    b = None if affine == "weight" else torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    if requires_grad:
        w.requires_grad_(True)
        if b is not None:
            b.requires_grad_(True)
    return w, b


def assert_matches_reference(got, ref, ref64, dtype: torch.dtype, tight: dict, what: str) -> None:
    """Results of one backend against the reference path's (``ref``) and float64's (``ref64``),
    in order (None where an input was absent, on both sides): the reference path's dtype;
    float32/float64 within ``tight[dtype]`` relative error of it; half precision within 2x the
    error of rounding the float64 result."""
    for i, (a, r, r64) in enumerate(zip(got, ref, ref64)):
        assert (a is None) == (r is None), (what, i)
        if a is None:
            continue
        assert a.dtype == r.dtype, (what, i, a.dtype, r.dtype)
        if dtype in HALF:
            assert_within_rounding(a, r64, 2.0, f"{what} #{i}")
        else:
            assert rel_err(a, r) < tight[dtype], (what, i, rel_err(a, r))


def assert_close_to_float64(got, ref64, dtype: torch.dtype, tight: dict, names) -> None:
    """Results (named ``names``) against a float64 run on the same inputs: each in ``dtype``;
    float32/float64 within ``tight[dtype]`` relative error, half precision within 2x the error
    of rounding the float64 result."""
    for name, a, r in zip(names, got, ref64):
        assert a.dtype == dtype, name
        if dtype in HALF:
            assert_within_rounding(a, r.detach(), 2.0, name)
        else:
            assert rel_err(a, r) < tight[dtype], (name, rel_err(a, r))


def graph_nodes(t: torch.Tensor, own_names: bool = False) -> list[str]:
    """Class names of every autograd node that ``t`` was computed through (``own_names``: each
    node's ``name()`` instead, which for a C++ node is its own class, not the binding's)."""
    seen, stack, names = set(), [t.grad_fn], []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(node.name() if own_names else type(node).__name__)
        stack.extend(n for n, _ in node.next_functions)
    return names


def ops_dispatched(call) -> tuple[list[str], BaseException | None]:
    """The torch ops (aten and ``normlab::``) dispatched while ``call()`` runs, and the exception it
    raised (None if none): whichever path the call takes, the C++ fast entries included (they
    call the registered ops through the dispatcher, which a dispatch mode sees)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    log = _Log()
    with log:
        try:
            call()
        except Exception as e:  # noqa: BLE001 - returned to the test, which asserts on it
            return log.ops, e
    return log.ops, None


# ----------------------------------------------------------------------------
# Compiled against eager: normlab's ops exactly, everything else to a derived error bound
# ----------------------------------------------------------------------------
#
# A compiled network and its eager twin run normlab's custom ops on the same kernels, but
# the code around them (inductor's generated conv/elementwise code, its fusions and
# reduction orders) differs from eager's and from one CPU (AVX2, AVX-512, thread count)
# to the next. So a compiled-vs-eager test checks two things:
#
# 1. normlab's ops: every ``normlab::*`` call the compiled graph makes is recorded at the
#    dispatcher (:func:`record_custom_ops`) and replayed eagerly on the same inputs; the
#    outputs must be the same bits (:func:`assert_replays_exactly`).
# 2. the network's results (output, input and parameter gradients, running statistics),
#    eager and compiled alike, against a float64 run of the same network
#    (:func:`float64_results`), within a bound derived from the magnitude of the terms
#    that were summed (:func:`error_magnitudes`, :func:`assert_within_error_bound`):
#
#    A sum of n terms computed in float32 in any order is off by at most
#    gamma_n * sum|t_k| (gamma_n = n u / (1 - n u) ~ n u, u = 2**-24), plus the errors its
#    terms already carried. Each layer computes q = J^T g (backward) or J t (forward), a
#    sum of nnz terms per entry (nnz: the non-zeros of that column / row of the layer's
#    Jacobian J, +2 for the mean-then-subtract two-stage sums a norm kernel does). By
#    induction over the layers, with M = |J_L|^T ... |J_1|^T |dout| (the backward run with
#    every Jacobian replaced by its absolute value; forward: |J| applied to |x| and |theta|),
#    |error| <= (sum over layers of gamma_{nnz_l}) * M <= K u M with K = sum_l (nnz_l + 2).
#    K and M are computed from the float64 run itself (Jacobians materialised by
#    autograd; the test networks are small). M is the magnitude of the terms that cancel:
#    a bias in front of a GroupNorm has a gradient that is zero up to rounding, and the
#    bound holds it to u times the sizes of what cancelled, not to its own size.
#    (First order in u; the forward's rounding perturbs the backward's Jacobians by
#    O(u) relative, which the per-step K of the forward layers covers.)

U64 = 2.0**-53


@dataclass
class OpCall:
    """One call of a custom op: its overload, the inputs before the call, and after it the
    outputs and (for a mutating op) the inputs again."""

    op: object
    args: tuple
    kwargs: dict
    out: object = None
    args_after: tuple = ()


def _clone(v):
    if isinstance(v, torch.Tensor):
        out = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
        return out.copy_(v) if v.numel() else out
    if isinstance(v, (list, tuple)):
        return type(v)(_clone(a) for a in v)
    return v


@contextlib.contextmanager
def record_custom_ops(namespace: str = "normlab", only: tuple[str, ...] | None = None):
    """Record every call of a ``<namespace>::*`` op with real (CPU) tensors while the block runs.

    A kernel on the BackendSelect key (just above the device kernels; fake tensors and
    functionalisation are handled above it and never reach it) clones the inputs, redispatches
    to the CPU kernel, and clones the outputs. It sees the calls an inductor-compiled graph
    makes, where a TorchDispatchMode would stop dynamo from running the compiled code, and
    works the same whether the op is defined in Python or registered from C++."""
    calls: list[OpCall] = []
    names = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith(namespace + "::")
                   and (only is None or n.split("::", 1)[1] in only))
    with torch.library._scoped_library(namespace, "IMPL") as lib:
        for qualname in names:
            packet = getattr(getattr(torch.ops, namespace), qualname.split("::", 1)[1])
            for overload in packet.overloads():
                op = getattr(packet, overload)

                def kernel(keyset, *args, _op=op, **kwargs):
                    if any(isinstance(a, torch.Tensor) and a.device.type == "meta" for a in args):
                        # the shapes pass of a compile (an op's Meta kernel), not a call to replay
                        return _op.redispatch(keyset.remove(torch._C.DispatchKey.BackendSelect), *args, **kwargs)
                    call = OpCall(_op, _clone(args), _clone(kwargs))
                    # on to the keys below this one (a bare CPU key set corrupts the heap here)
                    out = _op.redispatch(keyset.remove(torch._C.DispatchKey.BackendSelect), *args, **kwargs)
                    call.out, call.args_after = _clone(out), _clone(args)
                    calls.append(call)
                    return out

                name = qualname.split("::", 1)[1] + ("" if overload == "default" else "." + overload)
                lib.impl(name, kernel, "BackendSelect", with_keyset=True)
        yield calls


def _same_bits(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        if not (isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
                and (a.numel() < 2 or a.stride() == b.stride())):
            return False
        if a.dtype.is_floating_point:  # bits: NaNs alike, -0.0 is not 0.0
            bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
            a, b = a.contiguous().view(bits), b.contiguous().view(bits)
        return torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same_bits(x, y) for x, y in zip(a, b))
    return a == b


def assert_replays_exactly(calls: list[OpCall]) -> None:
    """Each recorded call, run again eagerly on (copies of) the same inputs, gives the same bits:
    the same outputs, and for a mutating op the same inputs after the call."""
    assert calls, "no custom op was called"
    for call in calls:
        args, kwargs = _clone(call.args), _clone(call.kwargs)
        out = call.op(*args, **kwargs)
        assert _same_bits(out, call.out), f"{call.op}: compiled and eager outputs differ on the same inputs"
        assert _same_bits(args, call.args_after), f"{call.op}: compiled and eager in-place results differ"


@dataclass
class Step:
    """One step of a test network: ``out = net(x)``, ``out.backward(dout(out))``; ``train``: the
    mode the whole network is set to first (None: the modules' modes as they are)."""

    train: bool | None = None
    dout: Callable[[torch.Tensor], torch.Tensor] = torch.ones_like


def run_steps(model, call, x, steps) -> dict[str, torch.Tensor]:
    """Run ``steps`` through ``call`` (``model`` itself or a compiled ``model``), gradients
    accumulating; returns each step's output and input gradient, then the parameters' gradients
    and the buffers, by name."""
    res = {}
    for k, step in enumerate(steps):
        if step.train is not None:
            model.train(step.train)
        xx = x.detach().clone().requires_grad_()
        out = call(xx)
        out.backward(step.dout(out))
        res[f"step{k}.out"], res[f"step{k}.x.grad"] = out.detach(), xx.grad
    res.update({f"{n}.grad": p.grad.clone() for n, p in model.named_parameters()})
    res.update({n: b.clone() for n, b in model.named_buffers()})
    return res


def float64_results(model, x, steps) -> dict[str, torch.Tensor]:
    """:func:`run_steps` on a float64 copy of ``model`` (its state as given) on the ``"ref"``
    backend: the oracle of the float32 runs."""
    import normlab

    m = copy.deepcopy(model).double()
    with normlab.use_backend("ref"):
        return run_steps(m, m, x.double(), steps)


@dataclass
class _Terms:
    """The bookkeeping of :func:`error_magnitudes`: K, and the running statistics' magnitudes."""

    k: float = 0.0
    buffers: dict = field(default_factory=dict)


class _AbsJacobian(torch.autograd.Function):
    """``fn(*inputs)`` (tensors; ``n_in`` of them carry gradients and tangents, the rest are
    parameters) whose backward is ``|J|^T g`` and whose jvp is ``|J_x| t + |J_p| |p|``: the
    magnitudes of the terms each entry sums (``g``, ``t`` non-negative)."""

    @staticmethod
    def forward(ctx, fn, terms, n_in, *inputs):
        def flat(*a):
            return torch.cat([y.reshape(-1) for y in fn(*a)])

        with torch.enable_grad():
            ys = [y.detach() for y in fn(*inputs)]
            try:
                js = torch.autograd.functional.jacobian(flat, inputs, vectorize=True)
            except RuntimeError:  # an op without a batching rule
                js = torch.autograd.functional.jacobian(flat, inputs)
        ctx.js = [j.reshape(-1, t.numel()).abs() for j, t in zip(js, inputs)]
        ctx.inputs, ctx.n_in, ctx.ys = inputs, n_in, [(y.shape, y.numel()) for y in ys]
        # terms per entry: a column (backward) or a row (forward) of J, +2 for two-stage sums
        whole = torch.cat(ctx.js, 1) != 0
        terms.k += max(int(whole.sum(0).max()), int(whole.sum(1).max())) + 2
        return tuple(ys) if len(ys) > 1 else ys[0]

    @staticmethod
    def backward(ctx, *gs):
        g = torch.cat([(torch.zeros(n, dtype=torch.float64) if gi is None else gi.reshape(-1))
                       for gi, (_, n) in zip(gs, ctx.ys)])
        return (None, None, None, *[(g @ j).reshape(t.shape) for j, t in zip(ctx.js, ctx.inputs)])

    @staticmethod
    def jvp(ctx, _fn, _terms, _n, *ts):
        out = 0
        for k, (j, t, p) in enumerate(zip(ctx.js, ts, ctx.inputs)):
            v = (t if k < ctx.n_in else p.abs()) if k >= ctx.n_in or t is not None else None
            if v is not None:
                out = out + j @ v.reshape(-1)
        outs, o = [], 0
        for shape, n in ctx.ys:
            outs.append((out[o : o + n] if torch.is_tensor(out) else torch.zeros(n, dtype=torch.float64)).reshape(shape))
            o += n
        return tuple(outs) if len(outs) > 1 else outs[0]


def _abs_module(module, terms: _Terms):
    """``module``'s forward (positional tensor inputs, one output or a tuple) through
    :class:`_AbsJacobian`, its Jacobian taken on a copy (state as at the call: the running
    statistics an eval step uses); a training step with running statistics also carries their
    magnitudes: (1 - momentum) M + momentum (mean of |x| + M_x, resp. of its square)."""
    import torch.autograd.forward_ad as fwad

    forward = module.forward
    names = [n for n, _ in module.named_parameters()]

    def abs_forward(*xs):
        n_in = len(xs)

        def fn(*a):
            twin = copy.deepcopy(module)
            del twin.forward  # the class's forward, not this wrapper
            y = torch.func.functional_call(twin, dict(zip(names, a[n_in:])), tuple(a[:n_in]))
            return tuple(y) if isinstance(y, (tuple, list)) else (y,)

        primals = [fwad.unpack_dual(x)[0].detach() for x in xs]
        if module.training and getattr(module, "running_mean", None) is not None:
            tangent = fwad.unpack_dual(xs[0])[1]
            mag = primals[0].abs() + (tangent.detach() if tangent is not None else 0)
            dims = [d for d in range(mag.dim()) if d != 1]
            n = mag.numel() / mag.shape[1] / (mag.shape[0] if "Instance" in type(module).__name__ else 1)
            mom = module.momentum
            prev = terms.buffers.setdefault(id(module), {"running_mean": module.running_mean.abs(),
                                                         "running_var": module.running_var.abs()})
            prev["running_mean"] = (1 - mom) * prev["running_mean"] + mom * mag.mean(dims)
            prev["running_var"] = (1 - mom) * prev["running_var"] + mom * (mag**2).mean(dims) * n / max(n - 1, 1)
        y = _AbsJacobian.apply(fn, terms, n_in, *xs, *[p for _, p in module.named_parameters()])
        if module.training:  # the module's own running statistics move, for a later eval step
            with torch.no_grad():
                forward(*primals)
        return y

    module.forward = abs_forward
    return forward


def error_magnitudes(model, x, steps) -> tuple[dict[str, torch.Tensor], float]:
    """``(M, K)`` of the bound ``|float32 - float64| <= K u M`` (see the note above) for each
    result of :func:`run_steps`: a float64 copy of ``model`` on the ``"ref"`` backend, every leaf
    module with parameters run through :class:`_AbsJacobian` (so the glue between them -- relu,
    scaling by positive constants, flattening, residual sums -- must keep magnitudes
    non-negative, as it does in the test networks), forward-mode AD carrying ``|x|``'s magnitude
    forward, the backward carrying ``|dout|``'s back."""
    import torch.autograd.forward_ad as fwad

    import normlab

    m = copy.deepcopy(model).double()
    terms = _Terms()
    for mod in m.modules():
        if next(mod.parameters(recurse=False), None) is not None:
            _abs_module(mod, terms)
    res = {}
    with normlab.use_backend("ref"), fwad.dual_level():
        for k, step in enumerate(steps):
            if step.train is not None:
                m.train(step.train)
            xx = x.detach().double().clone().requires_grad_()
            out, tangent = fwad.unpack_dual(m(fwad.make_dual(xx, xx.detach().abs())))
            out.backward(step.dout(out).abs())
            terms.k += 1  # the gradients accumulate over the steps
            res[f"step{k}.out"], res[f"step{k}.x.grad"] = tangent.detach(), xx.grad
    res.update({f"{n}.grad": p.grad.clone() for n, p in m.named_parameters()})
    for name, mod in m.named_modules():
        for b, t in mod.named_buffers(recurse=False):
            key = f"{name}.{b}" if name else b
            res[key] = terms.buffers.get(id(mod), {}).get(b, t.abs().double())
    return res, terms.k


def assert_within_error_bound(got: dict, ref: dict, mag: dict, k: float, what: str = "") -> None:
    """Every result within ``K (u + u64) M`` of the float64 one, elementwise (u: ``got``'s
    dtype's unit roundoff; integer buffers exactly)."""
    assert got.keys() == ref.keys() == mag.keys()
    for name, g in got.items():
        r = ref[name]
        if not g.dtype.is_floating_point:
            assert torch.equal(g, r), f"{what} {name}: {g} != {r}"
            continue
        u = torch.finfo(g.dtype).eps / 2
        bound = k * (u + U64) * mag[name]
        err = (g.double() - r).abs()
        worst = (err - bound).argmax()
        assert (err <= bound).all(), (
            f"{what} {name}: |error| {err.view(-1)[worst]:.3e} > bound {bound.view(-1)[worst]:.3e} "
            f"(K={k:.0f}, M={mag[name].view(-1)[worst]:.3e}, value {r.view(-1)[worst]:.3e})")


def check_compiled_against_eager(model, x, steps, backend, ops: set[str]) -> None:
    """``steps`` of ``model`` on the ``"cpu"`` backend, eager and under
    ``torch.compile(fullgraph=True, backend=backend)`` (each on its own copy): the compiled graph
    calls exactly the normlab ``ops``, each call giving the bits an eager call gives on the same
    inputs; and every result, eager and compiled, is within ``K u M`` of the float64 run."""
    import normlab

    ref = float64_results(model, x, steps)
    mag, k = error_magnitudes(model, x, steps)
    torch._dynamo.reset()
    with normlab.use_backend("cpu"):
        eager_model, compiled_model = copy.deepcopy(model), copy.deepcopy(model)
        eager = run_steps(eager_model, eager_model, x, steps)
        with record_custom_ops() as calls:
            compiled = run_steps(compiled_model, torch.compile(compiled_model, fullgraph=True, backend=backend),
                                 x, steps)
    assert {str(c.op) for c in calls} == ops
    assert_replays_exactly(calls)
    for what, got in (("eager", eager), (backend, compiled)):
        assert_within_error_bound(got, ref, mag, k, what)


# torch.compile's inductor backend compiles the C++ it generates: without a C++ compiler on PATH
# (a wheel installed where there is none -- scripts/wheel-check.sh) it cannot run at all, in torch
# as with normlab. Its tests skip there; the eager ops and the other compile backends do not.
HAS_CXX = bool(os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++"))
needs_cxx = pytest.mark.skipif(not HAS_CXX, reason="torch.compile's inductor needs a C++ compiler on PATH")


def group_norm_f64(x, w, b, dy, groups, center=0.0, eps=1e-5):
    """GroupNorm's y, dx, dweight, dbias in float64 from the (rounded) inputs, written from the
    derivation (docs/derivations/group_norm.md), on x - center (exact in float64 near the center,
    so a mean of 1e4 costs float64 nothing): dx = rstd (g - mean(g) - x_hat mean(g x_hat)),
    g = dy w."""
    x, w, b, dy = (t.double() for t in (x, w, b, dy))
    n, c = x.shape[:2]
    xg = (x - center).reshape(n, groups, -1)
    mean = xg.mean(-1, keepdim=True)
    var = ((xg - mean) ** 2).mean(-1, keepdim=True)
    rstd = 1 / torch.sqrt(var + eps)
    xhat = ((xg - mean) * rstd).reshape(x.shape)
    per_c = [1, c] + [1] * (x.dim() - 2)
    y = xhat * w.view(per_c) + b.view(per_c)
    g = (dy * w.view(per_c)).reshape(n, groups, -1)
    xh = xhat.reshape(n, groups, -1)
    dx = (rstd * (g - g.mean(-1, keepdim=True) - xh * (g * xh).mean(-1, keepdim=True))).reshape(x.shape)
    dims = [0] + list(range(2, x.dim()))
    return y, dx, (dy * xhat).sum(dims), dy.sum(dims)
