"""RMSNorm's casting variants (``casting="llama" | "gemma"``, ``offset``) on both backends.

Oracles: the variants' formulas written here in plain torch ops, as the models
that use them compute them (statistics in float32, then Llama rounds ``x_hat``
to the input's dtype before the weight multiplies it; Gemma multiplies by
``1 + w`` in float32 and rounds once), and their float64 evaluation.
"""

from __future__ import annotations

import pytest
import torch

import normlab
import normlab.functional as NF
from tests.oracle import rel_err, rounding_err

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
HALF = (torch.bfloat16, torch.float16)
BACKENDS = ["ref", "cpu"]
EPS = 1e-6


def llama_formula(x, w, eps=EPS, offset=0.0):
    """``w * x_hat.to(dtype)`` with the statistics in float32 (float64 for float64 input)."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    xa = x.to(acc)
    x_hat = xa * torch.rsqrt(xa.pow(2).mean(-1, keepdim=True) + eps)
    return (w + offset) * x_hat.to(x.dtype)


def gemma_formula(x, w, eps=EPS, offset=1.0):
    """``(x_hat * (offset + w.float())).to(dtype)``."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    xa = x.to(acc)
    x_hat = xa * torch.rsqrt(xa.pow(2).mean(-1, keepdim=True) + eps)
    return (x_hat * (offset + w.to(acc))).to(x.dtype)


FORMULAS = {"llama": (llama_formula, 0.0), "gemma": (gemma_formula, 1.0)}


def _data(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(dtype)
    w = (torch.randn(shape[-1], generator=g, dtype=torch.float64) * 0.5 + 0.2).to(dtype)
    dy = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return x, w, dy


def _ours(casting, offset):
    return lambda x, w: NF.rms_norm(x, (x.shape[-1],), w, EPS, casting=casting, offset=offset)


def _run(fn, x, w, dy, backend=None):
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    with normlab.use_backend(backend or "ref"):
        y = fn(x, w)
    y.backward(dy.to(y.dtype))
    return y.detach(), x.grad, w.grad


def _ulps_apart(a, b):
    """How far apart two half-precision tensors are, in units of their last place."""
    spacing = torch.finfo(a.dtype).eps * b.float().abs().clamp_min(torch.finfo(a.dtype).tiny)
    return ((a.float() - b.float()).abs() / spacing)


# ----------------------------------------------------------------------------
# forward: the formulas
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("casting", ["llama", "gemma"])
@pytest.mark.parametrize("shape", [(9, 40), (3, 5, 2100)], ids=["narrow", "wide"])
def test_forward_is_the_formula(backend, dtype, casting, shape):
    formula, offset = FORMULAS[casting]
    x, w, _ = _data(shape, dtype)
    with normlab.use_backend(backend):
        got = NF.rms_norm(x, (shape[-1],), w, EPS, casting=casting, offset=offset)
    want = formula(x, w)
    assert got.dtype == want.dtype == dtype
    if dtype in HALF:
        # the statistics may differ in their last float32 bit from torch's reduction order: a
        # rounding of the output then flips, rarely, by one unit in the last place
        ulps = _ulps_apart(got, want)
        assert ulps.max() <= 1.01 and (ulps > 0).float().mean() < 0.01, (ulps.max(), (ulps > 0).float().mean())
    else:
        assert rel_err(got, want) < (1e-6 if dtype == torch.float32 else 1e-13)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_llama_rounding_is_told_apart_from_torch_and_gemma(dtype):
    """The test above can fail: the other castings miss the Llama formula on many elements."""
    x, w, _ = _data((16, 256), dtype, seed=3)
    want = llama_formula(x, w)
    for casting in ("torch", "gemma"):
        with normlab.use_backend("cpu"):
            other = NF.rms_norm(x, (256,), w, EPS, casting=casting)
        assert (_ulps_apart(other, want) > 0).float().mean() > 0.05, casting


def test_gemma_offset_with_zero_weight_is_the_plain_norm():
    x, _, _ = _data((7, 33), torch.bfloat16)
    for backend in BACKENDS:
        with normlab.use_backend(backend):
            a = NF.rms_norm(x, (33,), torch.zeros(33, dtype=torch.bfloat16), EPS, casting="gemma", offset=1.0)
            b = NF.rms_norm(x, (33,), None, EPS)
        assert torch.equal(a, b), backend


@pytest.mark.parametrize("backend", BACKENDS)
def test_weight_of_another_dtype(backend):
    """Llama: the output takes the promoted dtype (float32 weight, bfloat16 input); Gemma: the
    input's dtype, the weight taken in float32; torch: rounded back to the input's dtype."""
    x, _, _ = _data((6, 24), torch.bfloat16)
    w = torch.randn(24, dtype=torch.float32)
    with normlab.use_backend(backend):
        y_llama = NF.rms_norm(x, (24,), w, EPS, casting="llama")
        y_gemma = NF.rms_norm(x, (24,), w, EPS, casting="gemma", offset=1.0)
        y_add, h = NF.add_rms_norm(x, torch.zeros_like(x), (24,), w, EPS, casting="llama")
    assert y_llama.dtype == torch.float32 and y_gemma.dtype == torch.bfloat16
    assert rel_err(y_llama, llama_formula(x, w)) < 1e-6
    assert rel_err(y_add, llama_formula(x, w)) < 1e-6 and torch.equal(h, x)
    assert (_ulps_apart(y_gemma, gemma_formula(x, w)) <= 1.01).all()


# ----------------------------------------------------------------------------
# backward: autograd of the formulas
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("casting", ["llama", "gemma"])
def test_gradcheck_float64(backend, casting):
    _, offset = FORMULAS[casting]
    x, w, _ = _data((4, 7), torch.float64)
    x.requires_grad_()
    w.requires_grad_()
    with normlab.use_backend(backend):
        fn = _ours(casting, offset)
        assert torch.autograd.gradcheck(fn, (x, w))
        assert torch.autograd.gradgradcheck(fn, (x, w))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("casting", ["llama", "gemma"])
@pytest.mark.parametrize("shape", [(9, 40), (3, 2100)], ids=["narrow", "wide"])
def test_float32_gradients_are_the_formulas(backend, casting, shape):
    formula, offset = FORMULAS[casting]
    x, w, dy = _data(shape, torch.float32)
    got = _run(_ours(casting, offset), x, w, dy, backend)
    want = _run(formula, x, w, dy)
    for name, a, b in zip(["y", "dx", "dw"], got, want):
        assert rel_err(a, b) < 1e-5, (name, rel_err(a, b))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("casting", ["llama", "gemma"])
@pytest.mark.parametrize("shape", [(64, 96), (4, 2100)], ids=["narrow", "wide"])
def test_half_gradients_within_twice_the_formulas_own_error(backend, dtype, casting, shape):
    """Against the formula run in float64 on the same inputs: within 2x the error of the formula
    itself run in ``dtype`` (autograd of torch ops), or of rounding the float64 result."""
    formula, offset = FORMULAS[casting]
    x, w, dy = _data(shape, dtype, seed=1)
    got = _run(_ours(casting, offset), x, w, dy, backend)
    theirs = _run(formula, x, w, dy)
    exact = _run(formula, x.double(), w.double(), dy.double())
    for name, a, t, e in zip(["y", "dx", "dw"], got, theirs, exact):
        assert a.dtype == dtype, name
        bound = 2 * max(rel_err(t, e), rounding_err(e, dtype))
        assert rel_err(a, e) <= bound, (name, rel_err(a, e), bound)


@pytest.mark.parametrize("casting", ["llama", "gemma"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fused_add_is_add_then_norm(casting, dtype):
    _, offset = FORMULAS[casting]
    x, w, dy = _data((12, 64), dtype, seed=2)
    r, _, dh = _data((12, 64), dtype, seed=4)
    results = []
    for backend in BACKENDS:
        xs, rs, ws = (t.clone().requires_grad_() for t in (x, r, w))
        with normlab.use_backend(backend):
            y, h = NF.add_rms_norm(xs, rs, (64,), ws, EPS, casting=casting, offset=offset)
        torch.autograd.backward([y, h], [dy, dh])
        results.append([y, h, xs.grad, rs.grad, ws.grad])
    xs, rs, ws = (t.clone().requires_grad_() for t in (x, r, w))
    h = xs + rs
    y = FORMULAS[casting][0](h, ws)
    torch.autograd.backward([y, h], [dy, dh])
    want = [y, h, xs.grad, rs.grad, ws.grad]
    for got in results:
        assert torch.equal(got[1], want[1])  # h: torch.add's rounding
        for name, a, b in zip(["y", "h", "dx", "dr", "dw"], got, want):
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            assert rel_err(a.detach(), b.detach()) < tol, (name, rel_err(a, b))


# ----------------------------------------------------------------------------
# the kernels: the same bits on 1 and 2 threads, the default path unchanged
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_one_and_two_threads_give_the_same_bits(dtype):
    x, w, dy = _data((512, 512), dtype, seed=5)  # large enough to split across threads
    r, _, _ = _data((512, 512), dtype, seed=6)
    threads = torch.get_num_threads()
    try:
        runs = []
        for n_threads in (1, 2):
            torch.set_num_threads(n_threads)
            out = []
            for casting, offset in (("llama", 0.0), ("gemma", 1.0)):
                out += _run(_ours(casting, offset), x, w, dy, "cpu")
                out += _run(lambda x, w: NF.add_rms_norm(x, r, (512,), w, EPS, casting=casting,
                                                         offset=offset)[0], x, w, dy, "cpu")
            runs.append(out)
    finally:
        torch.set_num_threads(threads)
    for i, (a, b) in enumerate(zip(*runs)):
        assert torch.equal(a, b), i


# ----------------------------------------------------------------------------
# transforms and compile
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("casting", ["llama", "gemma"])
def test_forward_mode_and_vmap(backend, casting):
    formula, offset = FORMULAS[casting]
    x, w, _ = _data((5, 6), torch.float64)
    xt, wt, _ = _data((5, 6), torch.float64, seed=9)
    with normlab.use_backend(backend):
        _, got = torch.func.jvp(_ours(casting, offset), (x, w), (xt, wt))
        ws = torch.stack([w, 2 * w])
        vm = torch.func.vmap(_ours(casting, offset), in_dims=(None, 0))(x, ws)
    _, want = torch.func.jvp(formula, (x, w), (xt, wt))
    assert rel_err(got, want) < 1e-12
    assert rel_err(vm, torch.stack([formula(x, w), formula(x, 2 * w)])) < 1e-12


@pytest.mark.parametrize("casting", ["llama", "gemma"])
def test_torch_compile_fullgraph(casting):
    formula, offset = FORMULAS[casting]
    m = normlab.nn.RMSNorm(16, eps=EPS, casting=casting, offset=offset)
    with torch.no_grad():
        m.weight.normal_()
    x = torch.randn(4, 16).bfloat16().requires_grad_()
    m = m.bfloat16()
    with normlab.use_backend("cpu"):
        y = torch.compile(m, fullgraph=True, backend="aot_eager")(x)
        y.float().sum().backward()
    want = formula(x.detach(), m.weight.detach())
    assert (_ulps_apart(y.detach(), want) <= 1.01).all()
    assert x.grad is not None and m.weight.grad is not None


# ----------------------------------------------------------------------------
# the module and bad arguments
# ----------------------------------------------------------------------------


def test_module_defaults_and_gemma_initialisation():
    plain = normlab.nn.RMSNorm(8, eps=1e-6)
    assert repr(plain) == repr(torch.nn.RMSNorm(8, eps=1e-6))
    gemma = normlab.nn.RMSNorm(8, eps=1e-6, casting="gemma", offset=1.0)
    assert torch.equal(gemma.weight, torch.zeros(8))
    assert list(gemma.state_dict()) == ["weight"]
    assert "casting='gemma'" in repr(gemma) and "offset=1.0" in repr(gemma)
    x = torch.randn(3, 8)
    assert torch.equal(gemma(x), plain(x))  # applied weight 1 + 0 == 1


def test_bad_arguments():
    x, w = torch.randn(3, 8), torch.randn(8)
    with pytest.raises(ValueError, match=r"casting to be one of 'torch', 'llama', 'gemma', got 'mistral'"):
        NF.rms_norm(x, (8,), w, casting="mistral")
    with pytest.raises(ValueError, match="casting"):
        NF.add_rms_norm(x, x, (8,), w, casting=None)
    with pytest.raises(TypeError, match="offset to be a finite float"):
        NF.rms_norm(x, (8,), w, offset="1")
    with pytest.raises(TypeError, match="offset to be a finite float"):
        NF.rms_norm(x, (8,), w, offset=float("nan"))
    with pytest.raises(ValueError, match="weight is None"):
        NF.rms_norm(x, (8,), None, offset=1.0)
    with pytest.raises(ValueError, match="elementwise_affine=False"):
        normlab.nn.RMSNorm(8, elementwise_affine=False, offset=1.0)
    with pytest.raises(RuntimeError, match=r"weight of shape \[8\]"):
        NF.rms_norm(x.bfloat16(), (8,), torch.ones(5), casting="llama")  # another dtype: still checked
    with pytest.raises(RuntimeError, match=r"weight of shape \[8\]"):
        NF.add_rms_norm(x.bfloat16(), x.bfloat16(), (8,), torch.ones(5), casting="llama")
    assert NF.rms_norm(x, (8,), w, offset=1).dtype == torch.float32  # an int offset is a number
