"""Local response normalization against its oracles: torch.nn.functional.local_response_norm and
torch.nn.CrossMapLRN2d's forward (float64), the float64 definition written as a loop over
channels, gradcheck/gradgradcheck of the hand-derived backward, jvp, vmap, and bad input."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import normlab
import normlab.functional as NF
from normlab.ops.local_response_norm import ref_local_response_norm

F64 = torch.float64
SHAPES = [(2, 7, 5), (2, 7, 3, 4), (2, 5, 2, 3, 2), (1, 4, 2, 1, 2, 3)]  # 3-D to 6-D
SIZES = [1, 2, 3, 4, 5, 8, 11]  # even and odd, larger than C


def _loop(x, size, alpha, beta, k, lo, hi, extra_zero=False):
    """The definition, one channel at a time: the window lo(c)..hi(c) of the channels that exist
    (with channel 0 too where ``extra_zero``), its sum of squares divided by ``size``."""
    c_total = x.shape[1]
    out = torch.empty_like(x)
    for c in range(c_total):
        js = [j for j in range(c_total) if lo(c) <= j <= hi(c) or (extra_zero and j == 0 and j <= hi(c))]
        s = sum((x[:, j] ** 2 for j in js), torch.zeros_like(x[:, 0]))
        out[:, c] = x[:, c] / (k + alpha * s / size) ** beta
    return out


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("size", SIZES)
def test_matches_torch_and_the_loop_float64(shape, size):
    g = torch.Generator().manual_seed(size)
    x = torch.randn(shape, generator=g, dtype=F64) * 2
    for backend in normlab.available_backends():
        with normlab.use_backend(backend):
            y = NF.local_response_norm(x, size, 0.3, 0.75, 1.5)
        torch.testing.assert_close(y, torch.nn.functional.local_response_norm(x, size, 0.3, 0.75, 1.5),
                                   rtol=1e-13, atol=1e-14)
    want = _loop(x, size, 0.3, 0.75, 1.5, lambda c: c - size // 2, lambda c: c + (size - 1) // 2)
    torch.testing.assert_close(y, want, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 6, 9, 12])
def test_cross_map_forward_is_torchs_with_its_window(size):
    x = torch.randn(2, 9, 3, 3, generator=torch.Generator().manual_seed(size), dtype=F64) * 3
    y = normlab.nn.CrossMapLRN2d(size, 0.5, 0.75, 1.0)(x)
    torch.testing.assert_close(y, torch.nn.CrossMapLRN2d(size, 0.5, 0.75, 1.0)(x), rtol=1e-13, atol=1e-14)
    p = (size - 1) // 2 + 1
    want = _loop(x, size, 0.5, 0.75, 1.0, lambda c: c - p + 1, lambda c: c + p - 1, extra_zero=True)
    torch.testing.assert_close(y, want, rtol=1e-13, atol=1e-14)


def test_cross_map_keeps_channel_zero_in_every_window_as_torch():
    x = torch.ones(1, 8, 1, 1, dtype=F64)
    x[0, 0] = 11.0
    ours, theirs = normlab.nn.CrossMapLRN2d(5, 1.0, 1.0, 1.0)(x), torch.nn.CrossMapLRN2d(5, 1.0, 1.0, 1.0)(x)
    torch.testing.assert_close(ours, theirs)
    assert ours[0, 4, 0, 0] == pytest.approx(1 / (1 + (121 + 5) / 5))  # channels 2..6 and channel 0


@pytest.mark.parametrize("kind", ["lrn", "cross_map"])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 7])
def test_gradcheck_and_gradgradcheck_of_the_hand_backward(kind, size):
    x = torch.randn(2, 6, 3, dtype=F64, generator=torch.Generator().manual_seed(size)).requires_grad_()
    f = lambda t: ref_local_response_norm(t, size, 0.3, 0.75, 1.5, kind)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x,))
    assert torch.autograd.gradgradcheck(f, (x,))


def test_lrn_gradient_equals_torchs_autograd():
    x = torch.randn(2, 5, 3, 4, dtype=F64, requires_grad=True)
    dy = torch.randn(2, 5, 3, 4, dtype=F64)
    (gx,) = torch.autograd.grad(NF.local_response_norm(x, 4, 0.2, 0.6, 2.0), x, dy)
    (tx,) = torch.autograd.grad(torch.nn.functional.local_response_norm(x, 4, 0.2, 0.6, 2.0), x, dy)
    torch.testing.assert_close(gx, tx, rtol=1e-12, atol=1e-13)


def test_torchs_cross_map_backward_fails_gradcheck_where_ours_passes():
    x = torch.randn(1, 6, 2, 2, dtype=F64, requires_grad=True)
    assert not torch.autograd.gradcheck(lambda t: torch.nn.CrossMapLRN2d(3, 0.5, 0.75, 1.0)(t), (x,),
                                        raise_exception=False)
    assert torch.autograd.gradcheck(lambda t: normlab.nn.CrossMapLRN2d(3, 0.5, 0.75, 1.0)(t), (x,))


def test_jvp_and_vmap():
    x = torch.randn(3, 2, 5, 4, dtype=F64)
    xt = torch.randn_like(x)
    f = lambda t: NF.local_response_norm(t, 3, 0.4, 0.75, 1.0)  # noqa: E731
    t = lambda t: torch.nn.functional.local_response_norm(t, 3, 0.4, 0.75, 1.0)  # noqa: E731
    y, yt = torch.func.jvp(f, (x,), (xt,))
    y2, yt2 = torch.func.jvp(t, (x,), (xt,))
    torch.testing.assert_close(y, y2)
    torch.testing.assert_close(yt, yt2)
    torch.testing.assert_close(torch.func.vmap(f)(x), torch.stack([t(x[i]) for i in range(3)]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_low_precision_within_twice_the_rounding_error(dtype):
    """The project's rule: the error against the exact (float64) result of the rounded input is at
    most twice the error of rounding that exact result to the dtype (and, in float32, at most
    twice torch's own error; torch has no float16/bfloat16 CPU kernel for 4-D input)."""
    x = (torch.randn(4, 16, 8, 8, dtype=F64, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    exact = torch.nn.functional.local_response_norm(x.double(), 5, 1e-2, 0.75, 1.0)
    ours = (NF.local_response_norm(x, 5, 1e-2, 0.75, 1.0).double() - exact).abs().max()
    rounding = (exact.to(dtype).double() - exact).abs().max()
    assert ours <= 2 * rounding, (ours, rounding)
    if dtype == torch.float32:
        theirs = (torch.nn.functional.local_response_norm(x, 5, 1e-2, 0.75, 1.0).double() - exact).abs().max()
        assert ours <= 2 * theirs, (ours, theirs)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 3), c=st.integers(1, 9), r=st.integers(1, 4), size=st.integers(1, 12),
       beta=st.floats(0.0, 2.0), k=st.floats(0.5, 3.0), alpha=st.floats(0.0, 2.0))
def test_hypothesis_matches_torch(n, c, r, size, beta, k, alpha):
    x = torch.randn(n, c, r, dtype=F64)
    torch.testing.assert_close(NF.local_response_norm(x, size, alpha, beta, k),
                               torch.nn.functional.local_response_norm(x, size, alpha, beta, k))


def test_empty_input_gives_an_empty_output():
    x = torch.randn(0, 3, 4)
    assert NF.local_response_norm(x, 2).shape == (0, 3, 4)
    assert normlab.nn.CrossMapLRN2d(2)(torch.randn(0, 3, 2, 2)).shape == (0, 3, 2, 2)


def test_backend_for_says_ref():
    assert normlab.backend_for(torch.randn(2, 3, 4), "local_response_norm") == "ref"


@pytest.mark.parametrize("size,exc,msg", [
    (0, RuntimeError, r"expected size >= 1 .*got 0"),
    (-2, RuntimeError, r"expected size >= 1 .*got -2"),
    (2.5, TypeError, r"expected size to be an int"),
    (True, TypeError, r"expected size to be an int"),
    (None, TypeError, r"expected size to be an int"),
])
def test_bad_size(size, exc, msg):
    x = torch.randn(2, 3, 4)
    with pytest.raises(exc, match=msg):
        NF.local_response_norm(x, size)
    with pytest.raises(exc):  # torch's class for the same mistake
        torch.nn.functional.local_response_norm(x, size)
    with pytest.raises(exc, match=msg):
        normlab.nn.LocalResponseNorm(size)
    with pytest.raises(exc, match=msg):
        normlab.nn.CrossMapLRN2d(size)


@pytest.mark.parametrize("shape", [(), (3,), (3, 4)])
def test_too_few_dims(shape):
    with pytest.raises(ValueError, match=r"expected an input of 3 or more dims .*got a \d-D input"):
        NF.local_response_norm(torch.randn(shape), 2)
    with pytest.raises(ValueError):
        torch.nn.functional.local_response_norm(torch.randn(shape), 2)


@pytest.mark.parametrize("shape", [(2, 3, 4), (2, 3, 4, 4, 4)])
def test_cross_map_takes_4d_only(shape):
    with pytest.raises(ValueError, match=r"CrossMapLRN2d: expected a 4-D input .*got a \d-D input"):
        normlab.nn.CrossMapLRN2d(3)(torch.randn(shape))
    with pytest.raises(ValueError):
        torch.nn.CrossMapLRN2d(3)(torch.randn(shape))


def test_alpha_of_another_type_and_integer_input():
    with pytest.raises(TypeError, match=r"expected alpha to be a float, got '1'"):
        NF.local_response_norm(torch.randn(2, 3, 4), 2, alpha="1")
    with pytest.raises(NotImplementedError, match=r"expected a floating-point input"):
        NF.local_response_norm(torch.ones(2, 3, 4, dtype=torch.long), 2)


@pytest.mark.parametrize("kind", ["lrn", "cross_map"])
@pytest.mark.parametrize("c", [1, 2, 3, 5, 9])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 6, 9, 12])
def test_band_sums_are_the_window_matrix(kind, c, size):
    """The code's band sums (and their transpose, the backward's) equal the definition's 0/1 matrix."""
    from normlab.ops.local_response_norm.reference import _window_sum, _window_sum_t, window

    t = torch.randn(2, c, 3, dtype=F64)
    m = window(c, size, kind)
    torch.testing.assert_close(_window_sum(t, size, kind), torch.matmul(m, t))
    torch.testing.assert_close(_window_sum_t(t, size, kind), torch.matmul(m.t(), t))


def test_same_bits_on_one_and_two_threads():
    x = torch.randn(4, 24, 9, 9, generator=torch.Generator().manual_seed(3), requires_grad=True)
    dy = torch.randn(4, 24, 9, 9, generator=torch.Generator().manual_seed(4))
    threads = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            y = NF.local_response_norm(x, 5, 1e-2, 0.75, 1.0)
            outs.append((y, torch.autograd.grad(y, x, dy)[0]))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_torch_compile_fullgraph():
    m = normlab.nn.LocalResponseNorm(3, 1e-2)
    x = torch.randn(2, 6, 4, 4, requires_grad=True)
    y = torch.compile(m, fullgraph=True, backend="aot_eager")(x)
    torch.testing.assert_close(y, torch.nn.functional.local_response_norm(x, 3, 1e-2))
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
