"""LayerNorm and RMSNorm math: torch.nn.functional and float64 references as oracles."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF
from hypothesis import given, settings
from hypothesis import strategies as st

import normlab
import normlab.functional as NF
from tests.oracle import (
    affine_params,
    assert_within_rounding,
    ops_dispatched,
    graph_nodes,
    rel_err,
)

ALL_DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]
HALF_DTYPES = [torch.bfloat16, torch.float16]


# ----------------------------------------------------------------------------
# gradients: gradcheck / gradgradcheck in float64
# ----------------------------------------------------------------------------

GRAD_CASES = [((3, 5), (5,)), ((2, 3, 4), (4,)), ((2, 3, 4), (3, 4)), ((1, 7), (7,))]


@pytest.mark.parametrize("x_shape,norm_shape", GRAD_CASES)
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
def test_layer_norm_gradcheck_and_gradgradcheck(x_shape, norm_shape, affine):
    x = torch.randn(x_shape, dtype=torch.float64, requires_grad=True)
    w, b = affine_params(norm_shape, affine, requires_grad=True)
    inputs = tuple(t for t in (x, w, b) if t is not None)

    def fn(*args):
        it = iter(args)
        xx = next(it)
        ww = next(it) if w is not None else None
        bb = next(it) if b is not None else None
        return NF.layer_norm(xx, norm_shape, ww, bb)

    assert torch.autograd.gradcheck(fn, inputs)
    assert torch.autograd.gradgradcheck(fn, inputs)


@pytest.mark.parametrize("x_shape,norm_shape", GRAD_CASES)
@pytest.mark.parametrize("affine", [True, False])
def test_rms_norm_gradcheck_and_gradgradcheck(x_shape, norm_shape, affine):
    x = torch.randn(x_shape, dtype=torch.float64, requires_grad=True)
    w, _ = affine_params(norm_shape, "weight" if affine else "none", requires_grad=True)
    inputs = (x, w) if affine else (x,)

    def fn(xx, ww=None):
        return NF.rms_norm(xx, norm_shape, ww)

    assert torch.autograd.gradcheck(fn, inputs)
    assert torch.autograd.gradgradcheck(fn, inputs)


@pytest.mark.parametrize("fn,name", [
    (lambda x, w: NF.layer_norm(x, (4,), w), "LayerNormFunction"),
    (lambda x, w: NF.rms_norm(x, (4,), w), "RMSNormFunction"),
])
def test_backward_is_the_hand_written_function(fn, name):
    """The graph holds our Function and no recorded reductions of the forward composite."""
    x = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(4, requires_grad=True)
    with normlab.use_backend("ref"):
        names = graph_nodes(fn(x, w))
    assert any(name in n for n in names), names
    assert not any(n.startswith(("Mean", "Sum", "Rsqrt", "Var", "Sub")) for n in names), names


# ----------------------------------------------------------------------------
# torch.nn.functional as the oracle
# ----------------------------------------------------------------------------

SHAPES = [((4, 6), (6,)), ((3, 5, 8), (8,)), ((32, 10, 512), (512,)), ((2, 3, 4, 5), (4, 5)), ((1, 16), (16,))]
TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def _compare_with_torch(fn_ours, fn_torch, x, params, dtype):
    """Forward and every gradient of ours vs torch's in ``dtype`` (float32/float64 only)."""
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    ps = [[p.clone().requires_grad_(True) if p is not None else None for p in params] for _ in range(2)]
    y_ours = fn_ours(xs[0], *ps[0])
    y_torch = fn_torch(xs[1], *ps[1])
    torch.testing.assert_close(y_ours, y_torch, atol=TOL[dtype], rtol=TOL[dtype])
    dy = torch.randn_like(y_torch)
    y_ours.backward(dy)
    y_torch.backward(dy)
    torch.testing.assert_close(xs[0].grad, xs[1].grad, atol=10 * TOL[dtype], rtol=10 * TOL[dtype])
    for p_ours, p_torch in zip(ps[0], ps[1]):
        if p_ours is not None:
            torch.testing.assert_close(p_ours.grad, p_torch.grad, atol=10 * TOL[dtype], rtol=10 * TOL[dtype])


@pytest.mark.parametrize("x_shape,norm_shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
def test_layer_norm_matches_torch(x_shape, norm_shape, dtype, affine):
    x = torch.randn(x_shape, dtype=dtype) * 2 + 1
    w, b = affine_params(norm_shape, affine, dtype)
    _compare_with_torch(
        lambda x, w, b: NF.layer_norm(x, norm_shape, w, b),
        lambda x, w, b: TF.layer_norm(x, norm_shape, w, b),
        x, [w, b], dtype,
    )


@pytest.mark.parametrize("x_shape,norm_shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("eps", [None, 1e-6])
def test_rms_norm_matches_torch(x_shape, norm_shape, dtype, eps):
    x = torch.randn(x_shape, dtype=dtype)
    w, _ = affine_params(norm_shape, "weight", dtype)
    _compare_with_torch(
        lambda x, w: NF.rms_norm(x, norm_shape, w, eps),
        lambda x, w: TF.rms_norm(x, norm_shape, w, eps),
        x, [w], dtype,
    )


@pytest.mark.parametrize("make_view", [
    lambda t: t.transpose(0, 1),                 # non-contiguous, trailing dim strided
    lambda t: t[:, ::2],                         # sliced
    lambda t: t.unsqueeze(0).expand(3, -1, -1),  # expanded (stride 0)
], ids=["transposed", "sliced", "expanded"])
def test_non_contiguous_input(make_view):
    base = torch.randn(6, 8, dtype=torch.float64)
    x = make_view(base)
    assert not x.is_contiguous()
    d = x.shape[-1]
    w, b = affine_params((d,), "both")
    torch.testing.assert_close(NF.layer_norm(x, (d,), w, b), TF.layer_norm(x, (d,), w, b))
    torch.testing.assert_close(NF.rms_norm(x, (d,), w), TF.rms_norm(x, (d,), w))


def test_mixed_precision_half_input_float32affine_params():
    """As in torch: bfloat16 input with float32 gamma/beta gives bfloat16 output, float32 grads."""
    x = torch.randn(8, 16).to(torch.bfloat16).requires_grad_(True)
    w = torch.randn(16, requires_grad=True)
    b = torch.randn(16, requires_grad=True)
    y = NF.layer_norm(x, (16,), w, b)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.bfloat16 and w.grad.dtype == torch.float32 and b.grad.dtype == torch.float32
    ref = TF.layer_norm(x.detach().double(), (16,), w.detach().double(), b.detach().double())
    assert_within_rounding(y.detach(), ref, what="mixed bf16 forward")


# ----------------------------------------------------------------------------
# numerics
# ----------------------------------------------------------------------------


def test_large_mean_rows_float32():
    """Rows with mean 1e4 and std 1: within 1e-3 of float64 computed from the same float32 input."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(256, 1024, generator=g, dtype=torch.float64) + 1e4).float()
    ref = TF.layer_norm(x.double(), (1024,))
    err = (NF.layer_norm(x, (1024,)).double() - ref).abs().max().item()
    assert err <= 1e-3, err


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("x_shape", [(64, 96), (4, 8, 256)])
def test_half_precision_within_twice_rounding_error(dtype, x_shape):
    g = torch.Generator().manual_seed(1)
    d = x_shape[-1]
    x = torch.randn(x_shape, generator=g).to(dtype)
    w = (torch.randn(d, generator=g) * 0.5 + 1).to(dtype)
    b = torch.randn(d, generator=g).to(dtype)
    dy = torch.randn(x_shape, generator=g).to(dtype)
    for fn_ours, fn_ref, params in [
        (lambda x, w, b: NF.layer_norm(x, (d,), w, b), lambda x, w, b: TF.layer_norm(x, (d,), w, b), [w, b]),
        (lambda x, w: NF.rms_norm(x, (d,), w), lambda x, w: TF.rms_norm(x, (d,), w), [w]),
    ]:
        ours_in = [t.clone().requires_grad_(True) for t in [x, *params]]
        ref_in = [t.double().requires_grad_(True) for t in [x, *params]]
        y = fn_ours(*ours_in)
        y_ref = fn_ref(*ref_in)
        y.backward(dy)
        y_ref.backward(dy.double())
        assert_within_rounding(y.detach(), y_ref.detach(), what=f"{dtype} y")
        for i, (a, r) in enumerate(zip(ours_in, ref_in)):
            assert a.grad.dtype == dtype
            assert_within_rounding(a.grad, r.grad, what=f"{dtype} grad of input {i}")


def test_bfloat16_backward_at_65536_rows_accumulates_dw_db_in_float32():
    """65,536 x 512 bfloat16: dweight/dbias summed over many rows stay within 2x rounding error."""
    g = torch.Generator().manual_seed(2)
    n, d = 65536, 512
    x = torch.randn(n, d, generator=g).to(torch.bfloat16)
    w = (torch.randn(d, generator=g) * 0.5 + 1).to(torch.bfloat16).requires_grad_(True)
    b = torch.randn(d, generator=g).to(torch.bfloat16).requires_grad_(True)
    dy = torch.randn(n, d, generator=g).to(torch.bfloat16)
    xr = x.clone().requires_grad_(True)
    y = NF.layer_norm(xr, (d,), w, b)
    y.backward(dy)
    x64 = x.double().requires_grad_(True)
    w64 = w.detach().double().requires_grad_(True)
    b64 = b.detach().double().requires_grad_(True)
    y64 = TF.layer_norm(x64, (d,), w64, b64)
    y64.backward(dy.double())
    assert_within_rounding(y.detach(), y64.detach(), what="y")
    assert_within_rounding(xr.grad, x64.grad, what="dx")
    assert_within_rounding(w.grad, w64.grad, what="dweight")
    assert_within_rounding(b.grad, b64.grad, what="dbias")


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_constant_row_gives_exactly_beta(dtype):
    x = torch.full((3, 7), 0.1, dtype=dtype)
    x[1] = 1e4 if dtype != torch.float16 else 1e3
    x[2] = -3.3
    w = torch.randn(7).to(dtype)
    b = torch.randn(7).to(dtype)
    y = NF.layer_norm(x, (7,), w, b)
    assert torch.equal(y, b.expand(3, 7))


def test_nan_and_inf_propagate_like_torch():
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([[1.0, nan, 2, 3], [1, inf, 2, 3], [1, 2, 3, 4], [-inf, 0, 0, inf], [0, 0, 0, 0]])
    for ours, ref in [
        (NF.layer_norm(x, (4,)), TF.layer_norm(x, (4,))),
        (NF.rms_norm(x, (4,)), TF.rms_norm(x, (4,))),
    ]:
        assert torch.equal(ours.isnan(), ref.isnan())
        assert torch.equal(ours.isinf(), ref.isinf())
        finite = ref.isfinite()
        torch.testing.assert_close(ours[finite], ref[finite])


# ----------------------------------------------------------------------------
# properties
# ----------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    n_mates=st.integers(min_value=0, max_value=5),
    d=st.integers(min_value=2, max_value=16),
    scale=st.floats(min_value=0.1, max_value=100.0),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_layer_norm_sample_is_independent_of_its_batch(n_mates, d, scale, seed):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(1, d, generator=g, dtype=torch.float64)
    mates = torch.randn(n_mates, d, generator=g, dtype=torch.float64) * scale
    w, b = affine_params((d,), "both", seed=seed)
    alone = NF.layer_norm(s, (d,), w, b)
    in_batch = NF.layer_norm(torch.cat([s, mates]), (d,), w, b)[:1]
    assert torch.equal(alone, in_batch)


# ----------------------------------------------------------------------------
# bad input: torch's exception class, a message naming expected and given
# ----------------------------------------------------------------------------


def test_errors_layer_norm():
    x = torch.randn(4, 6)
    with pytest.raises(RuntimeError, match=r"normalized_shape=\[5\].*\[\*, 5\].*\[4, 6\]"):
        NF.layer_norm(x, (5,))
    with pytest.raises(RuntimeError, match=r"\[\*, 3, 4, 6\].*\[4, 6\]"):
        NF.layer_norm(x, (3, 4, 6))
    with pytest.raises(RuntimeError, match="at least one dim"):
        NF.layer_norm(x, ())
    with pytest.raises(RuntimeError, match=r"weight of shape \[6\].*got weight of shape \[5\]"):
        NF.layer_norm(x, (6,), torch.ones(5))
    with pytest.raises(RuntimeError, match=r"bias of shape \[6\].*got bias of shape \[1\]"):
        NF.layer_norm(x, (6,), torch.ones(6), torch.ones(1))  # never broadcast
    with pytest.raises(NotImplementedError, match="floating-point.*torch.int64"):
        NF.layer_norm(torch.ones(4, 6, dtype=torch.long), (6,))
    with pytest.raises(RuntimeError, match="mixed dtypes.*torch.float64"):
        NF.layer_norm(x, (6,), torch.ones(6, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="mixed dtypes"):
        NF.layer_norm(x.double(), (6,), torch.ones(6))
    with pytest.raises(RuntimeError, match="device"):
        NF.layer_norm(x, (6,), torch.ones(6, device="meta"))
    with pytest.raises(TypeError, match="normalized_shape"):
        NF.layer_norm(x, "6")
    with pytest.raises(TypeError, match="torch.Tensor"):
        NF.layer_norm(x.numpy(), (6,))
    with pytest.raises(ValueError, match="eps"):
        NF.layer_norm(x, (6,), eps=-1.0)


def test_errors_rms_norm():
    x = torch.randn(4, 6)
    with pytest.raises(RuntimeError, match=r"\[\*, 7\]"):
        NF.rms_norm(x, (7,))
    with pytest.raises(RuntimeError, match=r"weight of shape \[6\].*\[3\]"):
        NF.rms_norm(x, (6,), torch.ones(3))
    with pytest.raises(NotImplementedError):
        NF.rms_norm(torch.ones(4, 6, dtype=torch.int32), (6,))


@pytest.mark.parametrize("backend", normlab.available_backends())
def test_errors_are_raised_before_any_work(backend):
    """A bad argument never reaches an op, on any backend: not one op is dispatched before the error."""
    x, w = torch.randn(4, 6), torch.ones(5)
    with normlab.use_backend(backend):
        ops, err = ops_dispatched(lambda: NF.layer_norm(x, (6,), w))
    assert isinstance(err, RuntimeError) and "weight of shape [6]" in str(err)
    assert ops == []
    with normlab.use_backend(backend):  # the oracle sees the ops of a good call
        ops, err = ops_dispatched(lambda: NF.layer_norm(x, (6,)))
    assert err is None and ops


def test_float64_error_is_tiny_against_float64_reference():
    x = torch.randn(50, 33, dtype=torch.float64)
    w, b = affine_params((33,), "both")
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    manual = (x - mean) / torch.sqrt(var + 1e-5) * w + b
    assert rel_err(NF.layer_norm(x, (33,), w, b), manual) < 1e-14
