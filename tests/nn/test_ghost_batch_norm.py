"""normlab.nn.GhostBatchNorm1d/2d/3d: BatchNorm over virtual batches, against BatchNorm chunk by chunk.

The oracle is torch.nn.BatchNorm applied to each virtual batch of consecutive
samples in turn (its running statistics updated once per virtual batch, in
order), and a float64 run of it for the low-precision rule.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import normlab
import normlab.functional as NF
from tests.oracle import assert_within_rounding, graph_nodes, rel_err

TORCH = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}
OURS = {2: normlab.nn.GhostBatchNorm1d, 3: normlab.nn.GhostBatchNorm1d, 4: normlab.nn.GhostBatchNorm2d,
        5: normlab.nn.GhostBatchNorm3d}


def _pair(shape, v, dtype=torch.float32, momentum=0.1, seed=0):
    g = torch.Generator().manual_seed(seed)
    c = shape[1]
    ours = OURS[len(shape)](c, v, momentum=momentum, dtype=dtype)
    theirs = TORCH[len(shape)](c, momentum=momentum, dtype=dtype)
    with torch.no_grad():
        for m in (ours, theirs):
            m.weight.copy_(torch.randn(c, generator=torch.Generator().manual_seed(seed + 1)) + 1)
            m.bias.copy_(torch.randn(c, generator=torch.Generator().manual_seed(seed + 2)))
            m.running_mean.fill_(0.3)
            m.running_var.fill_(1.7)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 1).to(dtype)
    dy = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return ours, theirs, x, dy


def _chunk_by_chunk(bn, x, v):
    return torch.cat([bn(chunk) for chunk in torch.split(x, v)])


def _step(ours, theirs, x, dy, v, backend="cpu"):
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    with normlab.use_backend(backend):
        ya = ours(xa)
    yb = _chunk_by_chunk(theirs, xb, v)
    ya.backward(dy)
    yb.backward(dy)
    return ([ya, xa.grad, ours.weight.grad, ours.bias.grad, ours.running_mean, ours.running_var],
            [yb, xb.grad, theirs.weight.grad, theirs.bias.grad, theirs.running_mean, theirs.running_var])


@pytest.mark.parametrize("backend", ["ref", "cpu"])
@pytest.mark.parametrize("shape,v", [((12, 3), 4), ((10, 3), 4), ((9, 2, 5), 3), ((8, 3, 4, 4), 2),
                                     ((7, 3, 3, 3), 3), ((6, 2, 2, 3, 3), 4), ((5, 3, 4, 4), 8)],
                         ids=str)
@pytest.mark.parametrize("momentum", [0.1, None])
def test_equals_batch_norm_chunk_by_chunk(backend, shape, v, momentum):
    ours, theirs, x, dy = _pair(shape, v, momentum=momentum)
    for step in range(2):  # twice: the running statistics and the count carry over
        got, want = _step(ours, theirs, x, dy, v, backend)
        for name, a, b in zip(["y", "dx", "dw", "db", "running_mean", "running_var"], got, want):
            assert rel_err(a, b) < 1e-5, (step, name, rel_err(a, b))
        assert int(ours.num_batches_tracked) == int(theirs.num_batches_tracked)
        ours.zero_grad()
        theirs.zero_grad()


def test_float64_is_exact():
    ours, theirs, x, dy = _pair((10, 3, 2, 2), 3, dtype=torch.float64)
    got, want = _step(ours, theirs, x, dy, 3)
    for a, b in zip(got, want):
        assert rel_err(a, b) < 1e-12


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_within_twice_the_rounding_error(dtype):
    ours, _, x, dy = _pair((12, 4, 3, 3), 4, dtype=dtype)
    _, exact, _, _ = _pair((12, 4, 3, 3), 4, dtype=torch.float64)
    xs = x.clone().requires_grad_()
    y = ours(xs)
    y.backward(dy)
    x64 = x.double().requires_grad_()
    y64 = _chunk_by_chunk(exact, x64, 4)
    y64.backward(dy.double())
    for name, a, r in zip(["y", "dx", "dw", "db"], [y, xs.grad, ours.weight.grad, ours.bias.grad],
                          [y64, x64.grad, exact.weight.grad, exact.bias.grad]):
        assert_within_rounding(a.detach(), r.detach(), 2.0, name, dtype=dtype)


@pytest.mark.parametrize("n,calls", [(12, 1), (10, 2)])
def test_one_batch_norm_kernel_call_for_the_full_virtual_batches(n, calls):
    """Seen from the autograd graph (each kernel call is one BatchNorm node): the k full virtual
    batches in one call, plus one for the rest."""
    m = normlab.nn.GhostBatchNorm2d(3, 4)
    with normlab.use_backend("cpu"):
        y = m(torch.randn(n, 3, 5, 5, requires_grad=True))
    names = graph_nodes(y, own_names=True)
    assert sum(name.startswith("BatchNorm") for name in names) == calls, names


def test_one_virtual_batch_is_batch_norm_bit_for_bit():
    ours, _, x, dy = _pair((6, 3, 4, 4), 6)
    bn = normlab.nn.BatchNorm2d(3)
    bn.load_state_dict(ours.state_dict())
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = ours(xa), bn(xb)
    ya.backward(dy)
    yb.backward(dy)
    assert torch.equal(ya, yb) and torch.equal(xa.grad, xb.grad)
    assert torch.equal(ours.running_var, bn.running_var)


def test_eval_state_dict_and_channels_last():
    ours, theirs, x, _ = _pair((8, 3, 4, 4), 4)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.eval()
    theirs.eval()
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-6)
    ours.train()
    cl = x.contiguous(memory_format=torch.channels_last)
    y = ours(cl)
    assert y.is_contiguous(memory_format=torch.channels_last)
    theirs.train()
    torch.testing.assert_close(y, _chunk_by_chunk(theirs, x, 4), rtol=1e-5, atol=1e-5)


def test_without_running_statistics():
    m = normlab.nn.GhostBatchNorm1d(3, 4, track_running_stats=False, affine=False)
    bn = nn.BatchNorm1d(3, track_running_stats=False, affine=False)
    x = torch.randn(10, 3)
    for mode in (True, False):  # no running statistics: batch statistics in eval too, as BatchNorm
        m.train(mode)
        torch.testing.assert_close(m(x), _chunk_by_chunk(bn, x, 4), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_gradcheck(backend):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, 2, 3, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(2, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(2, dtype=torch.float64, generator=g, requires_grad=True)
    with normlab.use_backend(backend):
        assert torch.autograd.gradcheck(lambda x, w, b: NF.ghost_batch_norm(x, 2, None, None, w, b), (x, w, b))


def test_torch_compile_fullgraph():
    m = normlab.nn.GhostBatchNorm2d(3, 4)
    ref = normlab.nn.GhostBatchNorm2d(3, 4)
    x = torch.randn(10, 3, 4, 4)
    y = torch.compile(m, fullgraph=True, backend="aot_eager")(x)
    torch.testing.assert_close(y, ref(x))
    torch.testing.assert_close(m.running_mean, ref.running_mean)
    assert int(m.num_batches_tracked) == 3


def test_bad_arguments():
    with pytest.raises(ValueError, match="virtual_batch_size to be a positive int.*got 0"):
        normlab.nn.GhostBatchNorm2d(3, 0)
    with pytest.raises(TypeError, match="virtual_batch_size to be a positive int.*got 2.5"):
        NF.ghost_batch_norm(torch.randn(4, 3), 2.5)
    m = normlab.nn.GhostBatchNorm1d(3, 4)
    with pytest.raises(RuntimeError, match=r"3 channels .* 5 channels"):
        m(torch.randn(8, 5))
    with pytest.raises(ValueError, match=r"virtual batch of 1 sample\(s\).*virtual_batch_size=4"):
        m(torch.randn(9, 3))  # 4 + 4 + 1: the last virtual batch has one value per channel
    assert int(m.num_batches_tracked) == 0
    with pytest.raises(ValueError, match="num_batches_tracked"):
        NF.ghost_batch_norm(torch.randn(8, 3), 4, torch.zeros(3), torch.ones(3), momentum=None)
