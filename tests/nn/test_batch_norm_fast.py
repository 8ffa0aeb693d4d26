"""BatchNorm's eager path: the module's lines (torch's: momentum factor, count, which statistics)
against torch.nn's module, and functional.batch_norm's C++ entry against the Python checks it
stands in for: same outputs, buffers, counts, version counters, gradients and errors."""

from __future__ import annotations

import pytest
import torch

import normlab
import normlab.functional as NF
from normlab.nn.batch_norm import BatchNorm1d, BatchNorm2d


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("track", [True, False])
def test_module_steps_match_torch_buffers_counts_and_versions(momentum, track):
    """The module's own lines (momentum factor, count, which statistics) against torch.nn's."""
    torch.manual_seed(0)
    ours, theirs = BatchNorm1d(5, momentum=momentum, track_running_stats=track), torch.nn.BatchNorm1d(
        5, momentum=momentum, track_running_stats=track)
    with torch.no_grad():
        theirs.weight.uniform_(0.5, 1.5)
        theirs.bias.uniform_(-1, 1)
    ours.load_state_dict(theirs.state_dict())
    v0 = {n: (a._version, b._version) for (n, a), (_, b) in zip(ours.named_buffers(), theirs.named_buffers())}
    for step in range(3):
        x = torch.randn(7, 5, 3)
        dy = torch.randn(7, 5, 3)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = ours(xa), theirs(xb)
        ya.backward(dy)
        yb.backward(dy)
        torch.testing.assert_close(ya, yb, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(xa.grad, xb.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ours.weight.grad, theirs.weight.grad, atol=1e-4, rtol=1e-4)
    for (name, a), (_, b) in zip(ours.named_buffers(), theirs.named_buffers()):
        if a.is_floating_point():
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
        else:
            assert torch.equal(a, b), name  # num_batches_tracked: 3 batches counted
        # each update moves the version counter once (torch's kernel leaves running_mean's and
        # running_var's unmoved; its num_batches_tracked += 1 moves that one's)
        assert a._version - v0[name][0] == 3, name
        if not a.is_floating_point():
            assert b._version - v0[name][1] == 3
    ours.eval()
    theirs.eval()
    x = torch.randn(4, 5)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)
    assert list(ours.state_dict()) == list(theirs.state_dict())


class _Doubled(torch.nn.Module):
    def forward(self, w):
        return 2 * w


@pytest.mark.parametrize("training", [True, False])
def test_a_parametrized_weight_is_the_one_used(training):
    """torch.nn.utils.parametrize moves ``weight`` out of ``_parameters`` (a property reads it):
    the forward reads what ``module.weight`` gives."""
    from torch.nn.utils import parametrize

    torch.manual_seed(3)
    ours, theirs = BatchNorm2d(3).train(training), torch.nn.BatchNorm2d(3).train(training)
    for m in (ours, theirs):
        with torch.no_grad():
            m.bias.fill_(0.5)
        parametrize.register_parametrization(m, "weight", _Doubled())
    x = torch.randn(2, 3, 4, 4)
    ya, yb = ours(x), theirs(x)
    torch.testing.assert_close(ya, yb, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(ya, NF.batch_norm(x, None, None, torch.ones(3), torch.full((3,), 0.5), True))
    ya.sum().backward()
    yb.sum().backward()
    torch.testing.assert_close(ours.parametrizations.weight.original.grad,
                               theirs.parametrizations.weight.original.grad, atol=1e-4, rtol=1e-4)
    assert int(ours.num_batches_tracked) == int(theirs.num_batches_tracked) == int(training)


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
