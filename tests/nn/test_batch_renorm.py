"""normlab.nn.BatchRenorm1d/2d/3d against Batch Renormalization written from the paper (Ioffe, 2017).

The oracle: Algorithm 1 in float64 torch ops -- batch mean and biased variance,
``r = clip(sigma_B / sigma, 1/r_max, r_max)`` and ``d = clip((mu_B - mu) / sigma, -d_max, d_max)``
from the running statistics before the update, both detached, ``y = w * ((x - mu_B) / sigma_B * r + d) + b``,
running statistics updated as BatchNorm's -- and torch.nn.BatchNorm where r_max=1, d_max=0.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import normlab
import normlab.functional as NF
from tests.oracle import assert_within_rounding, rel_err

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def paper(x, rm, rv, w, b, eps, r_max, d_max, momentum):
    """Algorithm 1 in float64; returns y and the updated running statistics."""
    dims = (0, *range(2, x.dim()))
    shape = (1, -1) + (1,) * (x.dim() - 2)
    mu_b = x.mean(dims)
    var_b = x.var(dims, unbiased=False)
    sigma_b = torch.sqrt(var_b + eps)
    sigma = torch.sqrt(rv + eps)
    r = (sigma_b / sigma).clamp(1 / r_max, r_max).detach()
    d = ((mu_b - rm) / sigma).clamp(-d_max, d_max).detach()
    x_hat = (x - mu_b.view(shape)) / sigma_b.view(shape) * r.view(shape) + d.view(shape)
    y = w.view(shape) * x_hat + b.view(shape)
    n = x.numel() // x.shape[1]
    new_rm = (1 - momentum) * rm + momentum * mu_b.detach()
    new_rv = (1 - momentum) * rv + momentum * var_b.detach() * n / (n - 1)
    return y, new_rm, new_rv


def _data(dtype, shape=(6, 5, 4, 3), seed=0, fmt=torch.contiguous_format):
    g = torch.Generator().manual_seed(seed)
    c = shape[1]
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 1.5 + 0.5).to(dtype).contiguous(memory_format=fmt)
    w = (torch.randn(c, generator=g, dtype=torch.float64) * 0.5 + 1).to(dtype)
    b = torch.randn(c, generator=g, dtype=torch.float64).to(dtype)
    # running statistics that put some channels' r and d inside the limits and some outside
    rm = torch.tensor([0.4, 3.0, -4.0, 0.6, 0.0], dtype=torch.float64)[:c].to(dtype)
    rv = torch.tensor([2.0, 0.05, 1.0, 40.0, 2.5], dtype=torch.float64)[:c].to(dtype)
    dy = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return x, w, b, rm, rv, dy


def _module(cls, dtype, w, b, rm, rv, **kw):
    m = cls(w.shape[0], dtype=dtype, **kw)
    with torch.no_grad():
        m.weight.copy_(w)
        m.bias.copy_(b)
        m.running_mean.copy_(rm)
        m.running_var.copy_(rv)
    return m


@pytest.mark.parametrize("backend", ["ref", "cpu"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fmt", ["nchw", "channels_last"])
def test_training_step_against_the_paper(backend, dtype, fmt):
    memory = torch.channels_last if fmt == "channels_last" else torch.contiguous_format
    x, w, b, rm, rv, dy = _data(dtype, fmt=memory)
    m = _module(normlab.nn.BatchRenorm2d, dtype, w, b, rm, rv, r_max=2.0, d_max=1.5)
    xs = x.clone().requires_grad_()
    with normlab.use_backend(backend):
        y = m(xs)
    y.backward(dy)
    assert y.dtype == dtype and y.is_contiguous(memory_format=memory)
    x64, w64, b64 = (t.double().requires_grad_() for t in (x, w, b))
    y64, rm64, rv64 = paper(x64, rm.double(), rv.double(), w64, b64, 1e-5, 2.0, 1.5, 0.1)
    y64.backward(dy.double())
    got = [y.detach(), xs.grad, m.weight.grad, m.bias.grad]
    want = [y64.detach(), x64.grad, w64.grad, b64.grad]
    for name, a, r in zip(["y", "dx", "dw", "db"], got, want):
        if dtype in (torch.bfloat16, torch.float16):
            assert_within_rounding(a, r, 2.0, name)
        else:
            assert rel_err(a, r) < (1e-5 if dtype == torch.float32 else 1e-12), (name, rel_err(a, r))
    tol = 1e-12 if dtype == torch.float64 else 1e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-6
    assert rel_err(m.running_mean, rm64) < tol and rel_err(m.running_var, rv64) < tol
    assert int(m.num_batches_tracked) == 1


def test_the_correction_is_active_in_the_test_above():
    """r and d are clipped for some channels and not for others: the test can tell them apart."""
    x, w, b, rm, rv, _ = _data(torch.float64)
    y_renorm, _, _ = paper(x, rm, rv, w, b, 1e-5, 2.0, 1.5, 0.1)
    y_bn, _, _ = paper(x, rm, rv, w, b, 1e-5, 1.0, 0.0, 0.1)
    per_channel = (y_renorm - y_bn).abs().amax(dim=(0, 2, 3))
    assert (per_channel > 1e-3).sum() >= 3


@pytest.mark.parametrize("backend", ["ref", "cpu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_r_max_1_d_max_0_is_batch_norm_bit_for_bit(backend, dtype):
    x, w, b, rm, rv, dy = _data(dtype)
    outs = []
    for cls, kw in ((normlab.nn.BatchRenorm2d, dict(r_max=1.0, d_max=0.0)), (normlab.nn.BatchNorm2d, {})):
        m = _module(cls, dtype, w, b, rm, rv, **kw)
        xs = x.clone().requires_grad_()
        with normlab.use_backend(backend):
            y = m(xs)
        y.backward(dy)
        outs.append([y, xs.grad, m.weight.grad, m.bias.grad, m.running_mean, m.running_var, m.num_batches_tracked])
    for a, t in zip(*outs):
        assert torch.equal(a, t)
    # and BatchNorm is torch's
    tm = _module(nn.BatchNorm2d, dtype, w, b, rm, rv)
    assert rel_err(tm(x.clone()), outs[0][0]) < 1e-2


def test_warmup_moves_the_limits_from_batch_norm_to_their_final_values():
    x, w, b, rm, rv, dy = _data(torch.float64)
    m = _module(normlab.nn.BatchRenorm2d, torch.float64, w, b, rm, rv, r_max=3.0, d_max=4.0, warmup_steps=4)
    bn = _module(normlab.nn.BatchNorm2d, torch.float64, w, b, rm, rv)
    assert m.limits() == (1.0, 0.0)
    assert torch.equal(m(x), bn(x))  # step 0: BatchNorm
    m(x)
    assert m.limits() == (2.0, 2.0)  # step 2 of 4: halfway
    state = m.state_dict()
    assert int(state["num_batches_tracked"]) == 2
    again = normlab.nn.BatchRenorm2d(5, r_max=3.0, d_max=4.0, warmup_steps=4, dtype=torch.float64)
    again.load_state_dict(state)
    assert again.limits() == (2.0, 2.0)
    y, _, _ = paper(x, m.running_mean, m.running_var, w, b, 1e-5, 2.0, 2.0, 0.1)
    assert rel_err(m(x), y) < 1e-12
    for _ in range(3):
        m(x)
    assert m.limits() == (3.0, 4.0)


def test_eval_is_batch_norm_eval():
    x, w, b, rm, rv, _ = _data(torch.float32)
    m = _module(normlab.nn.BatchRenorm2d, torch.float32, w, b, rm, rv).eval()
    bn = _module(nn.BatchNorm2d, torch.float32, w, b, rm, rv).eval()
    torch.testing.assert_close(m(x), bn(x), rtol=1e-5, atol=1e-6)
    assert int(m.num_batches_tracked) == 0 and torch.equal(m.running_mean, rm)


@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_gradcheck_where_r_and_d_are_clipped(backend):
    """r and d are constants of the backward; where both are clipped for every channel they are
    constants of the function too, so finite differences see the same derivative."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 3, 2, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(3, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, generator=g, requires_grad=True)
    rm, rv = torch.full((3,), 50.0, dtype=torch.float64), torch.full((3,), 400.0, dtype=torch.float64)

    def fn(x, w, b):
        return NF.batch_renorm(x, rm.clone(), rv.clone(), w, b, training=True, r_max=2.0, d_max=1.0)

    with normlab.use_backend(backend):
        assert torch.autograd.gradcheck(fn, (x, w, b))


@pytest.mark.parametrize("cls,shape", [(normlab.nn.BatchRenorm1d, (8, 3)), (normlab.nn.BatchRenorm1d, (4, 3, 5)),
                                       (normlab.nn.BatchRenorm3d, (2, 3, 2, 2, 2))])
def test_1d_and_3d(cls, shape):
    x = torch.randn(shape, dtype=torch.float64)
    m = cls(3, r_max=1.5, d_max=0.5, dtype=torch.float64)
    with torch.no_grad():
        m.running_mean.fill_(0.7)
        m.running_var.fill_(3.0)
    y, rm, rv = paper(x, m.running_mean.clone(), m.running_var.clone(), m.weight, m.bias, 1e-5, 1.5, 0.5, 0.1)
    assert rel_err(m(x), y) < 1e-12 and rel_err(m.running_var, rv) < 1e-12


def test_torch_compile_fullgraph_with_warmup():
    m = normlab.nn.BatchRenorm2d(4, warmup_steps=10)
    ref = normlab.nn.BatchRenorm2d(4, warmup_steps=10)
    x = torch.randn(8, 4, 3, 3)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    for _ in range(3):
        torch.testing.assert_close(compiled(x), ref(x), rtol=1e-5, atol=1e-5)
    assert int(m.num_batches_tracked) == 3
    torch.testing.assert_close(m.running_var, ref.running_var)


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"r_max >= 1.*got 0.5"):
        normlab.nn.BatchRenorm2d(4, r_max=0.5)
    with pytest.raises(ValueError, match=r"d_max >= 0.*got -1"):
        normlab.nn.BatchRenorm2d(4, d_max=-1)
    with pytest.raises(ValueError, match="warmup_steps to be an int >= 0"):
        normlab.nn.BatchRenorm2d(4, warmup_steps=-2)
    m = normlab.nn.BatchRenorm2d(4)
    with pytest.raises(RuntimeError, match=r"4 channels .* 5 channels"):
        m(torch.randn(2, 5, 3, 3))
    with pytest.raises(ValueError, match="expected 4D input"):
        m(torch.randn(2, 4, 3))
    with pytest.raises(ValueError, match="expected running_mean and running_var"):
        NF.batch_renorm(torch.randn(4, 3), None, None, training=True)
    with pytest.raises(ValueError, match=r"r_max >= 1"):
        NF.batch_renorm(torch.randn(4, 3), torch.zeros(3), torch.ones(3), training=True, r_max=0.0)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        m(torch.randn(1, 4, 1, 1))
    assert int(m.num_batches_tracked) == 0  # a rejected batch is not counted
