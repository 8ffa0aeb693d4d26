"""The ``"cpu"`` backend (the C++ kernels) of LayerNorm / RMSNorm and the fused residual adds.

Oracles: the reference path (backend ``"ref"``), torch.nn.functional, and a
float64 computation from the same (rounded) inputs. Low-precision results must
be within 2x the error of rounding the float64 result to their dtype.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF

import normlab
import normlab.functional as NF
from tests.oracle import (
    needs_cxx,
    HALF,
    saved_bytes_beyond_inputs,
    Step,
    assert_matches_reference,
    assert_within_rounding,
    check_compiled_against_eager,
    leaf,
    rel_err,
)

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
# (input shape, normalized_shape): rows from 20 to 2250 values, with and without a vector tail
CASES = [((7, 33), (33,)), ((2, 3, 40), (40,)), ((3, 4, 5), (4, 5)), ((3, 700), (700,)), ((5, 2100), (2100,)),
         ((2, 3, 50, 45), (50, 45))]
TIGHT = {torch.float32: 1e-5, torch.float64: 1e-12}


def _run(backend, fn, tensors, grads_out):
    """Run ``fn(*tensors)`` under ``backend``; backward with ``grads_out``; returns outputs + grads."""
    leaves = [leaf(t) for t in tensors]
    with normlab.use_backend(backend):
        out = fn(*leaves)
    out = out if isinstance(out, tuple) else (out,)
    torch.autograd.backward(out, grads_out[: len(out)])
    return [o.detach() for o in out] + [l.grad for l in leaves if l is not None]


def _inputs(shape, norm_shape, dtype, affine, seed=0, param_dtype=None):
    g = torch.Generator().manual_seed(seed)
    pd = param_dtype or dtype
    x = torch.randn(shape, generator=g).to(dtype)
    w = (1 + 0.5 * torch.randn(norm_shape, generator=g)).to(pd) if affine in ("both", "weight") else None
    b = (0.5 * torch.randn(norm_shape, generator=g)).to(pd) if affine == "both" else None
    dy = torch.randn(shape, generator=g).to(dtype)
    return x, w, b, dy


def _f64(t):
    return None if t is None else t.double()


# ----------------------------------------------------------------------------
# LayerNorm / RMSNorm against the reference path, float64 and torch
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
def test_layer_norm_matches_reference(dtype, case, affine):
    shape, ns = case
    x, w, b, dy = _inputs(shape, ns, dtype, affine)

    def fn(x, w, b):
        return NF.layer_norm(x, ns, w, b)

    got = _run("cpu", fn, (x, w, b), (dy,))
    ref = _run("ref", fn, (x, w, b), (dy,))
    ref64 = _run("ref", fn, (_f64(x), _f64(w), _f64(b)), (dy.double(),))
    assert_matches_reference(got, ref, ref64, dtype, TIGHT, "layer_norm")
    if dtype in (torch.float32, torch.float64):  # and torch itself
        tor = _run("ref", lambda x, w, b: TF.layer_norm(x, ns, w, b), (x, w, b), (dy,))
        for a, t in zip(got, tor):
            assert rel_err(a, t) < 1e-5


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("affine", ["weight", "none"])
def test_rms_norm_matches_reference(dtype, case, affine):
    shape, ns = case
    x, w, _, dy = _inputs(shape, ns, dtype, affine)

    def fn(x, w):
        return NF.rms_norm(x, ns, w)

    got = _run("cpu", fn, (x, w), (dy,))
    ref = _run("ref", fn, (x, w), (dy,))
    ref64 = _run("ref", lambda x, w: NF.rms_norm(x, ns, w, eps=torch.finfo(torch.float32).eps
                                                 if dtype != torch.float64 else None),
                 (_f64(x), _f64(w)), (dy.double(),))
    assert_matches_reference(got, ref, ref64, dtype, TIGHT, "rms_norm")
    if dtype in (torch.float32, torch.float64):
        tor = _run("ref", lambda x, w: TF.rms_norm(x, ns, w), (x, w), (dy,))
        for a, t in zip(got, tor):
            assert rel_err(a, t) < 1e-5


def test_mixed_precision_float32_params():
    """bfloat16 input with float32 weight/bias: y in bfloat16, dw/db in float32."""
    x, w, b, dy = _inputs((9, 24), (24,), torch.bfloat16, "both", param_dtype=torch.float32)
    fn = lambda x, w, b: NF.layer_norm(x, (24,), w, b)  # noqa: E731
    got = _run("cpu", fn, (x, w, b), (dy,))
    ref = _run("ref", fn, (x, w, b), (dy,))
    assert [t.dtype for t in got] == [torch.bfloat16, torch.bfloat16, torch.float32, torch.float32]
    for a, r in zip(got, ref):
        assert rel_err(a, r) < 1e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [4, 3000])  # one chunk of rows (summed in place) / many chunks (merged)
@pytest.mark.parametrize("b_dtype", ["same", "float32", None])
def test_backward_op_gives_parameter_grads_in_their_dtypes(dtype, rows, b_dtype):
    """layer_norm_bwd / rms_norm_bwd return dw in the weight's dtype and db in db_dtype, rounded
    once from the float32 sums: the bits of the float32 gradients (the same weight's values given
    in float32) converted by .to(). The Meta kernels give the same dtypes and shapes."""
    g = torch.Generator().manual_seed(rows)
    n = 40
    x, dy = (torch.randn(rows, n, generator=g).to(dtype) for _ in range(2))
    w = torch.randn(n, generator=g).to(dtype)
    db_dtype = {"same": dtype, "float32": torch.float32, None: None}[b_dtype]
    ops = torch.ops.normlab
    _, mean, rstd = ops.layer_norm_fwd(x, w, None, (n,), 1e-5)
    dx, dw, db = ops.layer_norm_bwd(dy, None, x, w, mean, rstd, (n,), True, db_dtype)
    dx32, dw32, db32 = ops.layer_norm_bwd(dy, None, x, w.float(), mean, rstd, (n,), True, None)
    assert (dw.dtype, db.dtype) == (dtype, db_dtype or torch.float32)
    assert (dw32.dtype, db32.dtype) == (torch.float32, torch.float32)
    assert torch.equal(dx, dx32)
    assert torch.equal(dw, dw32.to(dtype)) and torch.equal(db, db32.to(db.dtype))
    _, rs = ops.rms_norm_fwd(x, w, (n,), 0.0, False, 1e-5)
    dx_r, dw_r = ops.rms_norm_bwd(dy, None, x, w, rs, (n,), 0.0, False, True)
    dx_r32, dw_r32 = ops.rms_norm_bwd(dy, None, x, w.float(), rs, (n,), 0.0, False, True)
    assert torch.equal(dx_r, dx_r32)
    assert dw_r.dtype == dtype and torch.equal(dw_r, dw_r32.to(dtype))
    meta = [t.to("meta") for t in (dy, x, w, mean, rstd)]
    _, mdw, mdb = ops.layer_norm_bwd(meta[0], None, meta[1], meta[2], meta[3], meta[4], (n,), True, db_dtype)
    assert (mdw.dtype, mdw.shape, mdb.dtype, mdb.shape) == (dw.dtype, dw.shape, db.dtype, db.shape)


@pytest.mark.parametrize("which", ["transposed", "strided"])
def test_non_contiguous_input(which):
    g = torch.Generator().manual_seed(12)
    base = torch.randn(40, 12, generator=g)
    x = base.t() if which == "transposed" else base[:, ::2]  # (12, 40) / (40, 6)
    assert not x.is_contiguous()
    n = x.shape[-1]
    w, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
    dy = torch.randn(x.shape, generator=g)
    for fn in (lambda x, w, b: NF.layer_norm(x, (n,), w, b), lambda x, w, b: NF.rms_norm(x, (n,), w) + 0 * b.sum()):
        got = _run("cpu", fn, (x, w, b), (dy,))
        ref = _run("ref", fn, (x, w, b), (dy,))
        for i, (a, r) in enumerate(zip(got, ref)):  # a misread stride would be O(1) off
            assert torch.equal(a, r) or rel_err(a, r) < TIGHT[torch.float32], (which, i, rel_err(a, r))


def test_empty_batch():
    x = torch.randn(0, 5, requires_grad=True)
    with normlab.use_backend("cpu"):
        y = NF.layer_norm(x, (5,), torch.ones(5), torch.zeros(5))
    y.sum().backward()
    assert y.shape == (0, 5) and x.grad.shape == (0, 5)


# ----------------------------------------------------------------------------
# Fused residual add
# ----------------------------------------------------------------------------


def _add_fn(kind, ns):
    if kind == "layer":
        return lambda x, r, w, b: NF.add_layer_norm(x, r, ns, w, b)
    return lambda x, r, w, b: NF.add_rms_norm(x, r, ns, w)


def _torch_add_fn(kind, ns):
    def fn(x, r, w, b):
        h = x + r
        y = TF.layer_norm(h, ns, w, b) if kind == "layer" else TF.rms_norm(h, ns, w)
        return y, h

    return fn


@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_add_norm_matches_torch_add_then_norm(kind, dtype):
    # rows of 21 values: no vector width divides them, so every row's last values take the
    # kernels' scalar tail (where dh is added too)
    ns = (3, 7)
    g = torch.Generator().manual_seed(3)
    x, r = (torch.randn(5, 3, 7, generator=g).to(dtype) for _ in range(2))
    w, b = (1 + torch.randn(ns, generator=g)).to(dtype), torch.randn(ns, generator=g).to(dtype)
    dy, dh = (torch.randn(5, 3, 7, generator=g).to(dtype) for _ in range(2))
    got = _run("cpu", _add_fn(kind, ns), (x, r, w, b), (dy, dh))
    ref = _run("ref", _add_fn(kind, ns), (x, r, w, b), (dy, dh))
    tor = _run("ref", _torch_add_fn(kind, ns), (x, r, w, b), (dy, dh))
    names = ["y", "h", "dx", "dresidual", "dw", "db"]
    assert torch.equal(got[1], tor[1])  # h: the same rounded sum as torch.add
    if kind == "rms":  # torch.rms_norm has no bias: db is None everywhere
        got, ref, tor = ([t for t in ts if t is not None] for ts in (got, ref, tor))
        names.remove("db")
    if dtype in HALF:
        # float64 oracle from the same rounded h: y = norm(h), dx = dresidual = dnorm + dh
        h64 = got[1].double()
        o64 = _run("ref", lambda h, w, b: (_add_fn(kind, ns)(h, torch.zeros_like(h), w, b)[0]),
                   (h64, w.double(), b.double()), (dy.double(),))
        ref64 = [o64[0], h64, o64[1] + dh.double(), o64[1] + dh.double(), *o64[2:]]
        for name, a, r64 in zip(names, got, ref64):
            if name != "h":
                assert_within_rounding(a, r64, 2.0, name)
    else:
        for name, a, r, t in zip(names, got, ref, tor):
            assert rel_err(a, r) < TIGHT[dtype], name
            assert rel_err(a, t) < 1e-5, name


@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("used", ["y", "h"])
def test_add_norm_one_output_used(kind, used):
    """Gradients flow when only y (or only h) reaches the loss."""
    ns = (8,)
    x, r, w, b = torch.randn(6, 8), torch.randn(6, 8), torch.randn(8), torch.randn(8)
    d = torch.randn(6, 8)
    k = 0 if used == "y" else 1

    def pick(fn):
        return lambda *a: fn(*a)[k]

    got = _run("cpu", pick(_add_fn(kind, ns)), (x, r, w, b), (d,))
    tor = _run("ref", pick(_torch_add_fn(kind, ns)), (x, r, w, b), (d,))
    for a, t in zip(got, tor):
        if t is None:
            assert a is None or not a.any()
        else:
            assert a is not None and rel_err(a, t) < 1e-5


def test_add_norm_argument_errors():
    x = torch.randn(4, 6)
    with pytest.raises(RuntimeError, match=r"residual of the input's shape \[4, 6\].*\[4, 5\]"):
        NF.add_layer_norm(x, torch.randn(4, 5), (6,))
    with pytest.raises(RuntimeError, match=r"dtype torch.float32.*torch.float64"):
        NF.add_rms_norm(x, torch.randn(4, 6, dtype=torch.float64), (6,))
    with pytest.raises(TypeError, match="residual to be a torch.Tensor"):
        NF.add_layer_norm(x, 1.0, (6,))
    with pytest.raises(RuntimeError, match=r"\[\*, 7\]"):
        NF.add_layer_norm(x, x, (7,))
    with pytest.raises(RuntimeError, match=r"weight of shape \[6\]"):
        NF.add_rms_norm(x, x, (6,), torch.ones(3))


# ----------------------------------------------------------------------------
# Gradients: gradcheck, double backward
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"])
def test_gradcheck_and_gradgradcheck(name):
    g = torch.Generator().manual_seed(1)
    x, r = (torch.randn(3, 5, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    w = torch.randn(5, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, generator=g, dtype=torch.float64, requires_grad=True)
    fn, inputs = {
        "layer_norm": (lambda x, w, b: NF.layer_norm(x, (5,), w, b), (x, w, b)),
        "rms_norm": (lambda x, w: NF.rms_norm(x, (5,), w), (x, w)),
        "add_layer_norm": (lambda x, r, w, b: NF.add_layer_norm(x, r, (5,), w, b), (x, r, w, b)),
        "add_rms_norm": (lambda x, r, w: NF.add_rms_norm(x, r, (5,), w), (x, r, w)),
    }[name]
    with normlab.use_backend("cpu"):
        assert torch.autograd.gradcheck(fn, inputs)
        assert torch.autograd.gradgradcheck(fn, inputs)


# ----------------------------------------------------------------------------
# Determinism, NaN/Inf, large means
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n, cols", [(2048, 96), (96, 2560), (4096, 1024)], ids=["narrow", "wide", "long"])
def test_bitwise_identical_for_1_and_2_threads(dtype, n, cols):
    # rows of 96 and of 2560 values, and enough rows that the backward's dw/db chunks are
    # enlarged past 64 rows: several fixed row chunks, large enough to run on 2 threads
    x, w, b, dy = _inputs((n, cols), (cols,), dtype, "both", seed=5)
    r = torch.randn(n, cols).to(dtype)
    fns = [
        lambda x, w, b: NF.layer_norm(x, (cols,), w, b),
        lambda x, w, b: NF.rms_norm(x, (cols,), w) + 0 * b.sum(),
        lambda x, w, b: NF.add_layer_norm(x, r, (cols,), w, b)[0],
    ]
    before = torch.get_num_threads()
    try:
        for fn in fns:
            results = []
            for n in (1, 2, 2):
                torch.set_num_threads(n)
                results.append(_run("cpu", fn, (x, w, b), (dy,)))
            for other in results[1:]:
                for a, o in zip(results[0], other):
                    assert torch.equal(a, o)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("cols", [5, 15, 16, 17, 24, 31, 32, 33, 47, 48, 63, 64, 72, 75, 127, 128, 200, 255])
def test_a_row_gets_the_same_bits_alone_and_among_many(kind, cols):
    """Rows shorter than 16 vectors run 16 rows at a time (one row a lane, or 1-15 vectors
    and a tail for 16 rows together); a row alone runs the row path. Their sums add the same values in the same
    order, so y and dx of every row are the same bits either way (and dw / db stay within the rule)."""
    x, w, b, dy = _inputs((53, cols), (cols,), torch.float32, "both", seed=cols)
    x = x * 3 + 100  # a mean far from 0: the shift matters
    fn = ((lambda x, w, b: NF.layer_norm(x, (cols,), w, b)) if kind == "layer"
          else (lambda x, w, b: NF.rms_norm(x, (cols,), w) + 0 * b.sum()))
    many = _run("cpu", fn, (x, w, b), (dy,))
    for r in (0, 15, 16, 31, 47, 52):  # first and last of blocks, and rows past the last block
        one = _run("cpu", fn, (x[r:r + 1], w, b), (dy[r:r + 1],))
        assert torch.equal(many[0][r], one[0][0]) and torch.equal(many[1][r], one[1][0]), r
    f64 = _run("cpu", fn, (x.double(), w.double(), b.double()), (dy.double(),))
    for got, ref in zip(many[2:4 if kind == "layer" else 3], f64[2:]):  # dw, db (RMSNorm: dw; b is not used)
        assert rel_err(got, ref) < TIGHT[torch.float32], rel_err(got, ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_nan_and_inf_propagate_like_torch(dtype, kind):
    inf, nan = float("inf"), float("nan")
    x = torch.tensor(
        [[1.0, 2, 3, 4], [inf, 1, 2, 3], [1, inf, 2, 3], [1, nan, 2, 3], [-inf, inf, 1, 2], [5, 5, 5, 5]],
        dtype=dtype,
    )
    dy = torch.arange(4.0).expand(6, 4).to(dtype)
    fn = (lambda x: NF.layer_norm(x, (4,))) if kind == "layer" else (lambda x: NF.rms_norm(x, (4,)))
    tfn = (lambda x: TF.layer_norm(x, (4,))) if kind == "layer" else (lambda x: TF.rms_norm(x, (4,)))
    got = _run("cpu", fn, (x,), (dy,))
    tor = _run("ref", tfn, (x,), (dy,))
    for a, t in zip(got, tor):
        assert torch.equal(a.isnan(), t.isnan())
        assert torch.equal(a.isinf(), t.isinf())
        fin = a.isfinite()
        assert torch.allclose(a[fin].float(), t[fin].float(), atol=2e-2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_constant_row_gives_exactly_beta(dtype):
    b = torch.randn(16).to(dtype)
    x = torch.full((3, 16), 7.25, dtype=dtype)
    with normlab.use_backend("cpu"):
        y = NF.layer_norm(x, (16,), torch.randn(16).to(dtype), b)
    assert torch.equal(y, b.expand(3, 16))


def test_large_mean_rows_float32():
    """mean 1e4, std 1: the shifted two-pass statistics keep the float32 output accurate to < 1e-3."""
    g = torch.Generator().manual_seed(2)
    x = 1e4 + torch.randn(64, 256, generator=g)
    with normlab.use_backend("cpu"):
        y = NF.layer_norm(x, (256,))
        y_rms = NF.rms_norm(x - 1e4, (256,))
    exact = TF.layer_norm(x.double(), (256,))
    assert (y.double() - exact).abs().max() < 1e-3
    assert (y_rms.double() - TF.rms_norm((x - 1e4).double(), (256,), eps=1.1920928955078125e-07)).abs().max() < 1e-5


def test_layer_norm_bfloat16_within_2x_rounding_error_at_65536_x_512():
    """Output and every gradient within 2x the error of rounding the float64 result
    (dw/db sum 65,536 rows: fixed chunks merged in float64). float16 and RMSNorm
    are held to the same rule at small sizes above."""
    dtype = torch.bfloat16
    x, w, b, dy = _inputs((65536, 512), (512,), dtype, "both", seed=7)
    got = _run("cpu", lambda x, w, b: NF.layer_norm(x, (512,), w, b), (x, w, b), (dy,))
    # float64 oracle from the same rounded inputs: reference math in float64, no autograd
    from normlab.ops.layer_norm import layer_norm_backward_ref, layer_norm_ref

    y64, mean, rstd = layer_norm_ref(x.double(), w.double(), b.double(), 1e-5)
    dx64, dw64, db64 = layer_norm_backward_ref(dy.double(), x.double(), w.double(), mean, rstd)
    for name, a, r64 in zip(["y", "dx", "dw", "db"], got, [y64, dx64, dw64, db64]):
        assert_within_rounding(a, r64, 2.0, name)


# ----------------------------------------------------------------------------
# Integration: torch.compile, memory, backend registry, lazy import
# ----------------------------------------------------------------------------


class _AddLayerNorm(torch.nn.Module):
    """``NF.add_layer_norm`` as a module: ``(LayerNorm(a + b), a + b)``."""

    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(1 + 0.5 * torch.randn(n))
        self.bias = torch.nn.Parameter(0.5 * torch.randn(n))

    def forward(self, a, b):
        return NF.add_layer_norm(a, b, self.weight.shape, self.weight, self.bias)


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.add_ln = _AddLayerNorm(8)
        self.ln = normlab.nn.LayerNorm(8)
        self.rms = normlab.nn.RMSNorm(8)

    def forward(self, x):
        y, h = self.add_ln(self.lin(x), x)
        return self.rms(self.ln(y) + h)


def _eager_and_compiled(backend):
    torch.manual_seed(0)
    m = _Block()
    x = torch.randn(3, 5, 8)
    with normlab.use_backend("cpu"):
        results = []
        for model in (m, torch.compile(m, fullgraph=True, backend=backend)):
            xx = x.clone().requires_grad_()
            out = model(xx)
            out.backward(torch.ones_like(out))
            results.append([out.detach(), xx.grad] + [p.grad.clone() for p in m.parameters()])
            m.zero_grad()
    return results


def test_torch_compile_fullgraph_uses_the_custom_ops():
    from torch._dynamo.backends.common import aot_autograd
    from functorch.compile import make_boxed_func

    seen = {}

    def record(name):
        def compiler(gm, example_inputs):
            seen[name] = {str(n.target) for n in gm.graph.nodes if "normlab" in str(n.target)}
            return make_boxed_func(gm)

        return compiler

    eager, compiled = _eager_and_compiled(aot_autograd(fw_compiler=record("fw"), bw_compiler=record("bw")))
    for a, c in zip(eager, compiled):
        assert torch.allclose(a, c, atol=1e-6)
    assert seen["fw"] == {"normlab.add_layer_norm_fwd.default", "normlab.layer_norm_fwd.default",
                          "normlab.rms_norm_fwd.default"}
    assert seen["bw"] == {"normlab.layer_norm_bwd.default", "normlab.rms_norm_bwd.default"}


@needs_cxx
def test_torch_compile_inductor_matches_eager():
    """Each normlab op the compiled graph calls gives the bits an eager call gives on the same
    inputs; every result, eager and compiled, is within K u M of a float64 run (tests/oracle.py):
    inductor's linear and elementwise code differs from CPU to CPU, and the gradients in front
    of a LayerNorm are differences of larger terms."""
    torch.manual_seed(0)
    m = _Block()
    check_compiled_against_eager(m, torch.randn(3, 5, 8), [Step()], "inductor", {
        "normlab.add_layer_norm_fwd.default", "normlab.layer_norm_fwd.default",
        "normlab.rms_norm_fwd.default", "normlab.layer_norm_bwd.default", "normlab.rms_norm_bwd.default"})


def test_forward_keeps_nothing_activation_sized_beyond_x():
    """What the forward keeps for the backward, beyond the inputs themselves: at most three float64
    values per row (no activation-sized tensor: not y, not x_hat). Measured with torch's
    saved-tensor hooks, whatever the tensors are."""
    x = torch.randn(32, 16, requires_grad=True)
    w, b = torch.ones(16, requires_grad=True), torch.zeros(16, requires_grad=True)
    kept = saved_bytes_beyond_inputs(lambda: NF.layer_norm(x, (16,), w, b), x, w, b)
    assert kept <= 3 * 8 * 32, kept  # 32 rows


def test_backend_registry():
    x = torch.randn(2, 3)
    with normlab.use_backend("auto"):
        for op in ("layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"):
            assert normlab.backend_for(x, op) == "cpu"
        assert normlab.backend_for(x, "batch_norm") == "cpu"
        assert normlab.backend_for(x.to("meta"), "layer_norm") == "ref"
    for choice in ("auto", "cpu", "ref"):  # an op name normlab does not have, whatever the choice
        with normlab.use_backend(choice), pytest.raises(ValueError, match="unknown op 'no_such_op'"):
            normlab.backend_for(x, "no_such_op")
    with normlab.use_backend("cpu"):
        with pytest.raises(RuntimeError, match="cannot serve a torch.float32 tensor on meta"):
            normlab.backend_for(x.to("meta"), "layer_norm")
