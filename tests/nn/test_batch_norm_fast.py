"""BatchNorm's eager C++ entries (functional.batch_norm's fast path, the module forward in one
call) against the Python lines they stand in for: same outputs, buffers, counts, version
counters, gradients and errors."""

from __future__ import annotations

import pytest
import torch

import normlab
import normlab.functional as NF
from normlab.nn.batch_norm import BatchNorm1d, BatchNorm2d


class _Slow1d(BatchNorm1d):
    """BatchNorm1d on the Python lines: its own _check_input_dim turns the C++ entry off."""

    def _check_input_dim(self, input):
        super()._check_input_dim(input)


def test_a_subclass_with_its_own_checks_takes_the_python_lines():
    assert BatchNorm1d._fast_dims and BatchNorm2d._fast_dims
    assert _Slow1d._fast_dims == 0

    class Plain(BatchNorm2d):  # nothing overridden: the C++ entry stays
        pass

    assert Plain._fast_dims == BatchNorm2d._fast_dims


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("track", [True, False])
def test_module_entry_matches_the_python_lines(momentum, track):
    torch.manual_seed(0)
    fast, slow = BatchNorm1d(5, momentum=momentum, track_running_stats=track), _Slow1d(
        5, momentum=momentum, track_running_stats=track)
    with torch.no_grad():
        fast.weight.uniform_(0.5, 1.5)
        fast.bias.uniform_(-1, 1)
    slow.load_state_dict(fast.state_dict())
    v0 = {n: (a._version, b._version) for (n, a), (_, b) in zip(fast.named_buffers(), slow.named_buffers())}
    for step in range(3):
        x = torch.randn(7, 5, 3)
        dy = torch.randn(7, 5, 3)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = fast(xa), slow(xb)
        assert ya.grad_fn.name() == "BatchNormBackward"
        ya.backward(dy)
        yb.backward(dy)
        assert torch.equal(ya, yb) and torch.equal(xa.grad, xb.grad)
    assert torch.equal(fast.weight.grad, slow.weight.grad) and torch.equal(fast.bias.grad, slow.bias.grad)
    for (name, a), (_, b) in zip(fast.named_buffers(), slow.named_buffers()):
        assert torch.equal(a, b), name
        assert a._version - v0[name][0] == b._version - v0[name][1] > 0, name  # each update moves it
    fast.eval()
    slow.eval()
    x = torch.randn(4, 5)
    with torch.no_grad():
        assert torch.equal(fast(x), slow(x))
    assert list(fast.state_dict()) == list(slow.state_dict())


def test_module_entry_errors_and_state_left_alone():
    bn = BatchNorm1d(4)
    with pytest.raises(ValueError, match="expected 2D or 3D input"):
        bn(torch.randn(2, 4, 3, 3))
    with pytest.raises(RuntimeError, match="num_features"):
        bn(torch.randn(3, 5))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        bn(torch.randn(1, 4))
    assert int(bn.num_batches_tracked) == 0 and torch.equal(bn.running_mean, torch.zeros(4))
    bn.momentum = 1  # an int: the Python lines take it (the same blend)
    bn(torch.randn(3, 4))
    assert int(bn.num_batches_tracked) == 1


def test_functional_fast_path_declines_what_the_checks_word():
    x, rm, rv = torch.randn(4, 3), torch.zeros(3), torch.ones(3)
    with pytest.raises(TypeError, match="momentum"):
        NF.batch_norm(x, rm, rv, training=True, momentum=True)
    with pytest.raises(ValueError, match="momentum"):
        NF.batch_norm(x, rm, rv, training=True, momentum=1.5)
    with pytest.raises(ValueError, match="eps"):
        NF.batch_norm(x, rm, rv, training=True, eps=0.0)
    with pytest.raises(RuntimeError, match="running_mean"):
        NF.batch_norm(x, None, None, training=False)
    with pytest.raises(RuntimeError):
        NF.batch_norm(x, torch.zeros(4), rv, training=True)
    assert torch.equal(rm, torch.zeros(3)) and torch.equal(rv, torch.ones(3))
    a_m, a_v, b_m, b_v = rm.clone(), rv.clone(), rm.clone(), rv.clone()
    ya = NF.batch_norm(x, a_m, a_v, training=True, momentum=1)  # int: the Python checks, then the op
    yb = NF.batch_norm(x, b_m, b_v, training=True, momentum=1.0)  # float: the C++ entry
    assert torch.equal(ya, yb) and torch.equal(a_m, b_m) and torch.equal(a_v, b_v)


@pytest.mark.parametrize("training", [True, False])
def test_gradients_in_the_parameters_dtypes(training):
    torch.manual_seed(1)
    x = torch.randn(6, 3, 4).bfloat16().requires_grad_()
    w, b = torch.rand(3).add_(0.5).requires_grad_(), torch.randn(3).requires_grad_()
    rm, rv = torch.randn(3), torch.rand(3).add_(0.5)
    y = NF.batch_norm(x, rm, rv, w, b, training=training)
    dy = torch.randn_like(y)
    y.backward(dy)
    assert w.grad.dtype == torch.float32 and b.grad.dtype == torch.float32 and x.grad.dtype == torch.bfloat16
    # the op's gradients (the Autograd kernel's node, float64 sums rounded by .to())
    xr, wr, br = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    if training:
        yr, _ = torch.ops.normlab.batch_norm_fwd(xr, wr, br, 1e-5)
    else:
        yr = torch.ops.normlab.batch_norm_eval_fwd(xr, wr, br, rm, rv, 1e-5)
    yr.backward(dy)
    assert torch.equal(y, yr) and torch.equal(x.grad, xr.grad)
    assert torch.equal(w.grad, wr.grad) and torch.equal(b.grad, br.grad)


def test_double_backward_through_the_fast_path():
    torch.manual_seed(2)
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    w = torch.rand(3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    fn = lambda x, w, b: NF.batch_norm(x, None, None, w, b, training=True)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w, b))
    assert torch.autograd.gradgradcheck(fn, (x, w, b))


def test_no_grad_and_inference_mode():
    bn = BatchNorm2d(3)
    x = torch.randn(2, 3, 4, 4)
    with torch.inference_mode():
        y = bn(x)
    assert not y.requires_grad and int(bn.num_batches_tracked) == 1
    with torch.no_grad():
        y = bn(x.contiguous(memory_format=torch.channels_last))
    assert y.is_contiguous(memory_format=torch.channels_last) and int(bn.num_batches_tracked) == 2
    y_fast = bn.eval()(x)
    with normlab.use_backend("ref"):  # eager_cpu() False: the Python lines and the reference
        y_ref = bn(x)
    assert torch.allclose(y_fast, y_ref, atol=1e-6)
