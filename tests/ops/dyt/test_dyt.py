"""DyT against its definition in float64 (the paper's formula, ``tanh(alpha * x) * weight + bias``,
through torch's own autograd): values, every gradient, the forward-mode derivative, transforms,
the Module's state and what bad input is told -- on every backend."""

from __future__ import annotations

import math

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

import normlab
import normlab.functional as NF
from tests.oracle import assert_within_rounding, rel_err, rounding_err

BACKENDS = normlab.available_backends()[1:]  # "ref", and "cpu" where installed
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def unfused(x, alpha, w, b):
    """The paper's module as torch runs it, in the input's dtype (each op rounded)."""
    return torch.tanh(alpha * x) * w + b


def assert_accurate(got, ref64, torch_same_dtype, what, terms=None):
    """Within 2x the rounding of the float64 result, or as accurate as torch's own unfused ops in
    that dtype to within 10 % (several roundings in a row: dx is a product of four factors, each
    with its own rounding and tanh's); float64 to 1e-12. ``terms``: for a sum (dalpha), the float64
    terms it adds -- then the error may also reach 8 units of rounding of the sum of their
    magnitudes (each term carries a few roundings, and a sum of terms of both signs cancels)."""
    if got.dtype == torch.float64:
        torch.testing.assert_close(got, ref64, rtol=1e-12, atol=1e-12, msg=what)
        return
    err = rel_err(got, ref64)
    bound = max(2 * rounding_err(ref64, got.dtype), 1.1 * rel_err(torch_same_dtype, ref64))
    if terms is not None:
        u = torch.finfo(torch.float32).eps / 2
        bound = max(bound, 8 * u * terms.abs().sum().item() / ref64.double().norm().item())
    assert err <= bound, f"{what}: relative error {err:.3e} > {bound:.3e}"


def dalpha_terms(x, alpha, w, dy):
    """The float64 terms dalpha sums: dy * w * (1 - tanh(alpha x)^2) * x."""
    x, a, dy = x.double(), alpha.double(), dy.double()
    t = torch.tanh(a * x)
    g = dy * w.double() if w is not None else dy
    return g * (1 - t * t) * x


def oracle(x, alpha, w, b):
    """The definition, in float64."""
    y = torch.tanh(alpha.double() * x.double())
    if w is not None:
        y = y * w.double()
    if b is not None:
        y = y + b.double()
    return y


def _args(shape, n_cols_shape, dtype, seed=0, affine=True, param_dtype=None):
    g = torch.Generator().manual_seed(seed)
    pd = param_dtype or dtype
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 2).to(dtype)
    alpha = (torch.rand(1, generator=g, dtype=torch.float64) + 0.25).to(pd)
    w = (torch.randn(n_cols_shape, generator=g, dtype=torch.float64)).to(pd) if affine else None
    b = (torch.randn(n_cols_shape, generator=g, dtype=torch.float64)).to(pd) if affine else None
    return x, alpha, w, b


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,ns", [((4, 16), (16,)), ((2, 3, 40), (40,)), ((2, 5, 3, 4), (3, 4)), ((7,), (7,))])
def test_forward_and_gradients_within_rounding_of_float64(backend, dtype, shape, ns):
    x, alpha, w, b = _args(shape, ns, dtype)
    leaves = [t.clone().requires_grad_() for t in (x, alpha, w, b)]
    with normlab.use_backend(backend):
        y = NF.dyt(leaves[0], ns, *leaves[1:])
    refs = [t.detach().double().requires_grad_() for t in (x, alpha, w, b)]
    y64 = oracle(*refs)
    same = [t.detach().clone().requires_grad_() for t in (x, alpha, w, b)]
    yt = unfused(*same)
    assert y.dtype == dtype and y.shape == x.shape and y.is_contiguous()
    assert_accurate(y, y64.detach(), yt.detach(), "y")
    dy = torch.randn(shape, dtype=torch.float64).to(dtype)
    grads = torch.autograd.grad(y, leaves, dy)
    grads64 = torch.autograd.grad(y64, refs, dy.double())
    grads_t = torch.autograd.grad(yt, same, dy)
    for name, g, g64, gt, t in zip(("dx", "dalpha", "dweight", "dbias"), grads, grads64, grads_t, leaves):
        assert g.dtype == t.dtype and g.shape == t.shape
        assert_accurate(g, g64, gt, name, dalpha_terms(x, alpha, w, dy) if name == "dalpha" else None)


@pytest.mark.parametrize("backend", BACKENDS)
def test_half_input_with_float32_parameters(backend):
    x, alpha, w, b = _args((4, 8), (8,), torch.bfloat16, param_dtype=torch.float32)
    with normlab.use_backend(backend):
        y = NF.dyt(x, (8,), alpha, w, b)
    assert y.dtype == torch.bfloat16
    assert_within_rounding(y, oracle(x, alpha, w, b), what="y")


@pytest.mark.parametrize("layout", ["strided", "bfloat16"])
def test_parameters_read_where_they_lie_or_copied(layout):
    """The CPU kernel reads contiguous parameters of the accumulation dtype in place and copies the
    others (every stride, or another dtype): the same y either way, within rounding of the oracle."""
    x, alpha, w, b = _args((4, 8), (8,), torch.float32 if layout == "strided" else torch.bfloat16)
    if layout == "strided":
        w2, b2 = (torch.stack([t, -t], -1)[..., 0] for t in (w, b))  # every second value
        a2 = alpha
        assert not w2.is_contiguous() and not b2.is_contiguous()
    else:  # bfloat16 parameters beside bfloat16 x: converted to the float32 the kernel computes in
        w2, b2, a2 = w, b, alpha
    y = NF.dyt(x, (8,), a2, w2, b2)
    assert torch.equal(y, NF.dyt(x, (8,), a2.contiguous().float(), w2.contiguous().float(), b2.contiguous().float()))
    assert_within_rounding(y, oracle(x, alpha, w, b), what="y")


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradcheck_and_gradgradcheck_float64(backend):
    x, alpha, w, b = (t.requires_grad_() for t in _args((3, 5), (5,), torch.float64))
    with normlab.use_backend(backend):
        f = lambda x, a, w, b: NF.dyt(x, 5, a, w, b)  # noqa: E731
        assert gradcheck(f, (x, alpha, w, b))
        assert gradgradcheck(f, (x, alpha, w, b))


@pytest.mark.parametrize("backend", BACKENDS)
def test_without_affine_and_with_a_float_alpha(backend):
    x, _, _, _ = _args((3, 6), (6,), torch.float64)
    with normlab.use_backend(backend):
        y = NF.dyt(x, (6,), 0.7)
    torch.testing.assert_close(y, torch.tanh(0.7 * x), rtol=1e-15, atol=1e-15)


@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_mode_and_vmap_agree_with_the_definition(backend):
    from torch.func import jvp, vmap

    x, alpha, w, b = _args((3, 6), (6,), torch.float64)
    tangents = tuple(torch.randn_like(t) for t in (x, alpha, w, b))
    with normlab.use_backend(backend):
        y, yt = jvp(lambda *a: NF.dyt(a[0], 6, *a[1:]), (x, alpha, w, b), tangents)
        yv = vmap(lambda xi: NF.dyt(xi, 6, alpha, w, b))(x.reshape(3, 1, 6))
    y64, yt64 = jvp(oracle, (x, alpha, w, b), tangents)
    torch.testing.assert_close(y, y64, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(yt, yt64, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(yv.reshape(3, 6), y64, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_input(backend):
    x = torch.randn(0, 4, requires_grad=True)
    m = normlab.nn.DyT(4)
    with normlab.use_backend(backend):
        y = m(x)
    assert y.shape == (0, 4)
    y.sum().backward()
    assert torch.equal(m.weight.grad, torch.zeros(4)) and torch.equal(m.alpha.grad, torch.zeros(1))


def test_module_parameters_state_dict_and_reset():
    m = normlab.nn.DyT((3, 4), alpha_init=0.8)
    assert list(m.state_dict()) == ["alpha", "weight", "bias"]
    assert m.alpha.shape == (1,) and m.weight.shape == (3, 4) and m.bias.shape == (3, 4)
    assert m.alpha.item() == pytest.approx(0.8) and torch.equal(m.weight, torch.ones(3, 4))
    assert normlab.nn.DyT(4, bias=False).bias is None
    n = normlab.nn.DyT(4, elementwise_affine=False)
    assert n.weight is None and n.bias is None and list(n.state_dict()) == ["alpha"]
    with torch.no_grad():
        m.alpha.fill_(3.0)
    m.reset_parameters()
    assert m.alpha.item() == pytest.approx(0.8)
    assert normlab.nn.DyT(4, dtype=torch.bfloat16).alpha.dtype == torch.bfloat16
    assert "alpha_init=0.8" in repr(m)


@pytest.mark.parametrize("kwargs,exc,match", [
    ({"normalized_shape": 4, "alpha_init": math.inf}, ValueError, "expected alpha_init to be finite"),
    ({"normalized_shape": 4, "alpha_init": math.nan}, ValueError, "expected alpha_init to be finite"),
    ({"normalized_shape": 4, "alpha_init": "0.5"}, TypeError, "expected alpha_init to be a float"),
    ({"normalized_shape": ()}, RuntimeError, "at least one dim"),
    ({"normalized_shape": 4, "dtype": torch.int32}, RuntimeError, "floating-point dtype"),
])
def test_module_refuses_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        normlab.nn.DyT(**kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("call,exc,match", [
    (lambda: NF.dyt(torch.randn(2, 4), (5,), 0.5), RuntimeError, r"expected input with shape \[\*, 5\]"),
    (lambda: NF.dyt(torch.randn(2, 4), (4,), 0.5, torch.ones(3)), RuntimeError, r"weight of shape \[4\]"),
    (lambda: NF.dyt(torch.randn(2, 4), (4,), torch.ones(2)), RuntimeError, r"alpha of shape \[1\]"),
    (lambda: NF.dyt(torch.randn(2, 4), (4,), math.inf), ValueError, "alpha to be finite"),
    (lambda: NF.dyt(torch.randn(2, 4), (4,), "a"), TypeError, "alpha to be a torch.Tensor"),
    (lambda: NF.dyt(torch.randn(2, 4), (4,), torch.ones(1, dtype=torch.float64)), RuntimeError, "mixed dtypes"),
    (lambda: NF.dyt(torch.ones(2, 4, dtype=torch.int64), (4,), 0.5), NotImplementedError, "floating-point input"),
    (lambda: NF.dyt([1.0], (1,), 0.5), TypeError, "torch.Tensor"),
])
def test_bad_input_is_refused_before_any_work(backend, call, exc, match):
    with normlab.use_backend(backend), pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(9, 5000), (3000, 40)], ids=str)
def test_kernel_blocks_and_chunks_within_rounding(shape, dtype):
    """Rows cut into column blocks (5000 columns) and many row chunks (3000 rows): the kernel's
    task geometry; every output against the definition in float64."""
    x, alpha, w, b = _args(shape, shape[-1:], dtype, seed=3)
    leaves = [t.clone().requires_grad_() for t in (x, alpha, w, b)]
    with normlab.use_backend("auto"):
        y = NF.dyt(leaves[0], shape[-1:], *leaves[1:])
    refs = [t.detach().double().requires_grad_() for t in (x, alpha, w, b)]
    same = [t.detach().clone().requires_grad_() for t in (x, alpha, w, b)]
    y64, yt = oracle(*refs), unfused(*same)
    assert_accurate(y, y64.detach(), yt.detach(), "y")
    dy = torch.randn(shape, dtype=torch.float64).to(dtype)
    for name, g, g64, gt in zip(("dx", "dalpha", "dweight", "dbias"), torch.autograd.grad(y, leaves, dy),
                                torch.autograd.grad(y64, refs, dy.double()), torch.autograd.grad(yt, same, dy)):
        assert_accurate(g, g64, gt, name, dalpha_terms(x, alpha, w, dy) if name == "dalpha" else None)


@pytest.mark.skipif("cpu" not in BACKENDS, reason="the C++ kernels are not built")
@pytest.mark.parametrize("n_cols", [16, 40, 771])
@pytest.mark.parametrize("affine", ["both", "weight", "bias", "none"])
def test_bfloat16_rows_the_same_bits_as_each_row_alone(n_cols, affine):
    """bfloat16 input of several rows runs the kernel's even/odd pairs of vectors (weight and bias
    reordered once a call); a single row runs the values in order: every row of the batch must be
    the same bits as that row alone, within rounding of the float64 definition, with NaN and
    infinities in x carried as the definition carries them."""
    x, alpha, w, b = _args((6, n_cols), (n_cols,), torch.bfloat16, seed=5, param_dtype=torch.float32)
    x[1, 3], x[2, -1], x[4, 0] = float("nan"), float("inf"), float("-inf")
    w = w if affine in ("both", "weight") else None
    b = b if affine in ("both", "bias") else None
    with normlab.use_backend("cpu"), torch.no_grad():
        y = NF.dyt(x, (n_cols,), alpha, w, b)
        rows = torch.cat([NF.dyt(x[r:r + 1], (n_cols,), alpha, w, b) for r in range(x.shape[0])])
    assert torch.equal(y.view(torch.int16), rows.view(torch.int16))
    y64 = oracle(x, alpha, w, b)
    assert torch.equal(y.isnan(), y64.isnan())
    fin = y64.isfinite()
    assert_within_rounding(y[fin], y64[fin])


def test_torch_compile_fullgraph():
    m = normlab.nn.DyT(8)
    with torch.no_grad():
        m.weight.normal_()
        m.bias.normal_()
    x = torch.randn(4, 8, requires_grad=True)
    with normlab.use_backend("cpu"):
        y = torch.compile(m, fullgraph=True, backend="aot_eager")(x)
    y.sum().backward()
    x64 = x.detach().double().requires_grad_()
    y64 = oracle(x64, m.alpha.detach(), m.weight.detach(), m.bias.detach())
    y64.sum().backward()
    torch.testing.assert_close(y, y64.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, x64.grad.float(), rtol=1e-5, atol=1e-5)
