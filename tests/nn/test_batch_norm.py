"""normlab.nn.BatchNorm1d/2d/3d as drop-ins for torch.nn's: torch.nn is the oracle."""

from __future__ import annotations

import copy
import inspect
from collections import OrderedDict

import pytest
import torch
from torch import nn

import normlab
from tests.oracle import assert_within_rounding

CLASSES = {
    1: (normlab.nn.BatchNorm1d, nn.BatchNorm1d, [(6, 3), (4, 3, 5)]),
    2: (normlab.nn.BatchNorm2d, nn.BatchNorm2d, [(3, 3, 4, 5)]),
    3: (normlab.nn.BatchNorm3d, nn.BatchNorm3d, [(2, 3, 2, 3, 4)]),
}
KWARG_SETS = [
    {},
    {"affine": False},
    {"bias": False},
    {"track_running_stats": False},
    {"affine": False, "track_running_stats": False},
    {"momentum": None},
    {"momentum": 0.5, "eps": 1e-3},
]


def _pair(rank, seed=0, dtype=torch.float32, **kwargs):
    """A normlab module and a torch module with the same (random) parameters."""
    ours_cls, torch_cls, _ = CLASSES[rank]
    ref = torch_cls(3, dtype=dtype, **kwargs)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        if ref.weight is not None:
            ref.weight.copy_(1 + 0.5 * torch.randn(3, generator=g))
        if ref.bias is not None:
            ref.bias.copy_(torch.randn(3, generator=g))
    ours = ours_cls(3, dtype=dtype, **kwargs)
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ours, ref


def _x(shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 0.5 * seed).to(dtype)


def _assert_same_state(ours, ref, **tol):
    sd, sdt = ours.state_dict(), ref.state_dict()
    assert list(sd) == list(sdt)
    for k in sd:
        assert sd[k].dtype == sdt[k].dtype, k
        torch.testing.assert_close(sd[k], sdt[k], **tol)


# --------------------------------------------------------------------------
# Construction: signature, parameters, buffers, repr
# --------------------------------------------------------------------------


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_constructor_signature_is_torchs(rank):
    ours_cls, torch_cls, _ = CLASSES[rank]
    ours = inspect.signature(ours_cls.__init__).parameters
    ref = inspect.signature(torch_cls.__init__).parameters
    assert list(ours) == list(ref)
    for name in ref:
        assert ours[name].kind == ref[name].kind, name
        assert ours[name].default == ref[name].default, name


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("kwargs", KWARG_SETS, ids=str)
def test_parameters_buffers_and_repr_match_torch(rank, kwargs):
    ours_cls, torch_cls, _ = CLASSES[rank]
    ours, ref = ours_cls(3, **kwargs), torch_cls(3, **kwargs)
    assert repr(ours) == repr(ref)  # e.g. "BatchNorm1d(3, eps=1e-05, momentum=0.1, ...)"
    assert ours.extra_repr() == ref.extra_repr()
    assert list(ours._parameters) == list(ref._parameters)
    assert list(ours._buffers) == list(ref._buffers)
    for name in ref._parameters:
        p, pt = getattr(ours, name), getattr(ref, name)
        assert (p is None) == (pt is None), name
        if pt is not None:
            assert isinstance(p, nn.Parameter) and torch.equal(p, pt) and p.dtype == pt.dtype
    for name in ref._buffers:
        t, tt = getattr(ours, name), getattr(ref, name)
        assert (t is None) == (tt is None), name
        if tt is not None:
            assert torch.equal(t, tt) and t.dtype == tt.dtype and t.shape == tt.shape
    _assert_same_state(ours, ref)
    assert ours._version == ref._version == 2


def test_bias_false_registers_no_bias():
    """bias=False must never create a bias (unlike some libraries do)."""
    m = normlab.nn.BatchNorm2d(4, bias=False)
    assert m.bias is None and "bias" not in m.state_dict()
    assert [n for n, _ in m.named_parameters()] == ["weight"]


def test_factory_kwargs():
    m = normlab.nn.BatchNorm2d(4, dtype=torch.float64, device="cpu")
    assert m.weight.dtype == m.bias.dtype == m.running_mean.dtype == m.running_var.dtype == torch.float64
    assert m.num_batches_tracked.dtype == torch.long and m.num_batches_tracked.shape == ()


def test_reset_running_stats_and_parameters():
    ours, ref = _pair(2)
    ours.train(), ref.train()
    for m in (ours, ref):
        m(_x((3, 3, 2, 2), 1))
        m.reset_running_stats()
    _assert_same_state(ours, ref)
    assert int(ours.num_batches_tracked) == 0 and torch.equal(ours.running_var, torch.ones(3))
    assert not torch.equal(ours.weight, torch.ones(3))  # reset_running_stats leaves gamma
    ours.reset_parameters()
    assert torch.equal(ours.weight, torch.ones(3)) and torch.equal(ours.bias, torch.zeros(3))


# --------------------------------------------------------------------------
# Forward semantics: several training steps then eval, against torch
# --------------------------------------------------------------------------


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("kwargs", KWARG_SETS, ids=str)
def test_training_steps_then_eval_match_torch(rank, kwargs):
    ours, ref = _pair(rank, **kwargs)
    shapes = CLASSES[rank][2]
    for step in range(4):
        x = _x(shapes[step % len(shapes)], seed=step)
        xo, xt = x.clone().requires_grad_(), x.clone().requires_grad_()
        y, yt = ours(xo), ref(xt)
        torch.testing.assert_close(y, yt, rtol=1e-5, atol=1e-5)
        dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(100 + step))
        y.backward(dy)
        yt.backward(dy)
        torch.testing.assert_close(xo.grad, xt.grad, rtol=1e-4, atol=1e-4)
        for p, pt in zip(ours.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, pt.grad, rtol=1e-4, atol=1e-4)
        _assert_same_state(ours, ref, rtol=1e-5, atol=1e-6)  # running stats, num_batches_tracked
    if ref.track_running_stats:
        assert int(ours.num_batches_tracked) == 4
    ours.eval(), ref.eval()
    x = _x(shapes[0], seed=50)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)
    _assert_same_state(ours, ref, rtol=1e-5, atol=1e-6)  # eval leaves the state alone


@pytest.mark.parametrize("momentum", [0.1, 0.5, None])
def test_running_stats_after_several_steps_float64(momentum):
    """Running stats equal torch's, and (independently) the closed-form blend of batch stats."""
    ours, ref = _pair(2, dtype=torch.float64, momentum=momentum)
    expected_mean, expected_var = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    for step in range(5):
        x = _x((2, 3, 3, 2), seed=step, dtype=torch.float64)
        ours(x), ref(x)
        per_channel = x.transpose(0, 1).reshape(3, -1)
        m = 1.0 / (step + 1) if momentum is None else momentum
        expected_mean = (1 - m) * expected_mean + m * per_channel.mean(dim=1)
        expected_var = (1 - m) * expected_var + m * per_channel.var(dim=1, correction=1)
    _assert_same_state(ours, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours.running_mean, expected_mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours.running_var, expected_var, rtol=1e-12, atol=1e-12)
    assert int(ours.num_batches_tracked) == int(ref.num_batches_tracked) == 5


def test_momentum_none_is_plain_average_of_batch_stats():
    m = normlab.nn.BatchNorm1d(2, momentum=None, dtype=torch.float64)
    batches = [_x((4, 2), seed=s, dtype=torch.float64) for s in range(3)]
    for x in batches:
        m(x)
    torch.testing.assert_close(m.running_mean, torch.stack([x.mean(0) for x in batches]).mean(0))
    torch.testing.assert_close(m.running_var, torch.stack([x.var(0) for x in batches]).mean(0))


def test_track_running_stats_false_uses_batch_stats_in_eval():
    ours, ref = _pair(2, track_running_stats=False)
    ours.eval(), ref.eval()
    x = _x((3, 3, 2, 2), seed=3)
    y = ours(x)
    torch.testing.assert_close(y, ref(x), rtol=1e-5, atol=1e-5)
    # batch statistics: every channel of (y - bias) / weight has mean 0 and variance ~1
    z = (y - ours.bias.view(1, 3, 1, 1)) / ours.weight.view(1, 3, 1, 1)
    torch.testing.assert_close(z.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-5, rtol=0)
    assert ours.running_mean is None and ours.num_batches_tracked is None
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
        ours(torch.randn(1, 3, 1, 1))  # eval, but batch statistics: torch raises too


def test_eval_with_running_stats_accepts_batch_of_one():
    ours, ref = _pair(2)
    for m in (ours, ref):
        m(_x((4, 3, 2, 2), 1))
        m.eval()
    x = _x((1, 3, 1, 1), seed=2)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)


def test_eval_after_running_stats_set_to_none_uses_batch_stats():
    """torch's rule: batch statistics when both running buffers are None."""
    ours, ref = _pair(2)
    for m in (ours, ref):
        m.eval()
        m.running_mean = None
        m.running_var = None
    x = _x((3, 3, 2, 2), seed=4)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)


def test_channels_last_module():
    ours, ref = _pair(2)
    x = _x((2, 3, 4, 5), seed=5).contiguous(memory_format=torch.channels_last)
    for training in (True, False):
        ours.train(training), ref.train(training)
        y, yt = ours(x), ref(x)
        assert yt.is_contiguous(memory_format=torch.channels_last)
        assert y.stride() == yt.stride()
        torch.testing.assert_close(y, yt, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_input_float32_module(dtype):
    ours, ref = _pair(2)
    x = _x((4, 3, 3, 3), seed=6, dtype=dtype).requires_grad_()
    y = ours(x)
    yt = ref(x.detach())
    assert y.dtype == yt.dtype == dtype
    torch.testing.assert_close(y.float(), yt.float(), rtol=2e-2, atol=2e-2)
    y.float().sum().backward()
    assert ours.weight.grad.dtype == torch.float32 and x.grad.dtype == dtype
    assert ours.running_mean.dtype == torch.float32
    torch.testing.assert_close(ours.running_mean, ref.running_mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.running_var, ref.running_var, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------
# state_dict: both directions, and checkpoints from before num_batches_tracked
# --------------------------------------------------------------------------


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("kwargs", [{}, {"affine": False}, {"bias": False}, {"track_running_stats": False}], ids=str)
def test_state_dict_round_trip_both_directions(rank, kwargs):
    ours_cls, torch_cls, shapes = CLASSES[rank]
    src_t = torch_cls(3, **kwargs)
    src_o = ours_cls(3, **kwargs)
    with torch.no_grad():
        for src in (src_t, src_o):
            for p in src.parameters():
                p.copy_(torch.randn(3))
    for step in range(3):  # move the running stats and the counter
        src_t(_x(shapes[0], seed=step))
        src_o(_x(shapes[0], seed=10 + step))
    dst_o, dst_t = ours_cls(3, **kwargs), torch_cls(3, **kwargs)
    for dst, src in ((dst_o, src_t), (dst_t, src_o)):
        result = dst.load_state_dict(src.state_dict(), strict=True)
        assert not result.missing_keys and not result.unexpected_keys
    _assert_same_state(dst_o, src_t, rtol=0, atol=0)
    _assert_same_state(dst_t, src_o, rtol=0, atol=0)
    x = _x(shapes[-1], seed=20)
    for a, b in ((dst_o, src_t), (dst_t, src_o)):
        a.eval(), b.eval()
        torch.testing.assert_close(a(x), b(x), rtol=1e-6, atol=1e-6)


def _old_checkpoint(module):
    """``module``'s state_dict as written before version 2 (no num_batches_tracked)."""
    sd = module.state_dict()
    del sd["num_batches_tracked"]
    old = OrderedDict(sd)
    old._metadata = OrderedDict({"": {"version": 1}})
    return old


@pytest.mark.parametrize("cls", [normlab.nn.BatchNorm2d, nn.BatchNorm2d], ids=["normlab", "torch"])
def test_old_checkpoint_without_num_batches_tracked_loads(cls):
    src = nn.BatchNorm2d(3)
    src(_x((2, 3, 2, 2), seed=1))
    dst = cls(3)
    dst.num_batches_tracked.fill_(7)
    dst.load_state_dict(_old_checkpoint(src), strict=True)  # no "missing key" error
    torch.testing.assert_close(dst.running_mean, src.running_mean, rtol=0, atol=0)
    assert int(dst.num_batches_tracked) == 7  # the module's own count is kept, as torch does


def test_version_2_checkpoint_missing_num_batches_tracked_is_an_error_like_torch():
    for cls in (normlab.nn.BatchNorm2d, nn.BatchNorm2d):
        sd = nn.BatchNorm2d(3).state_dict()
        del sd["num_batches_tracked"]  # metadata still says version 2
        with pytest.raises(RuntimeError, match="num_batches_tracked"):
            cls(3).load_state_dict(sd, strict=True)


def test_state_dict_metadata_version_and_deepcopy():
    m = normlab.nn.BatchNorm1d(3)
    assert m.state_dict()._metadata[""]["version"] == 2
    c = copy.deepcopy(m)
    c(_x((4, 3), seed=1))
    assert int(m.num_batches_tracked) == 0 and int(c.num_batches_tracked) == 1


# --------------------------------------------------------------------------
# Bad input: torch's class and message
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rank, bad_shape",
    [(1, (4,)), (1, (2, 3, 4, 4)), (2, (2, 3, 4)), (2, (2, 3, 2, 2, 2)), (3, (2, 3, 4, 4))],
)
def test_wrong_rank_raises_torchs_value_error(rank, bad_shape):
    ours_cls, torch_cls, _ = CLASSES[rank]
    x = torch.randn(bad_shape)
    with pytest.raises(ValueError) as ref_err:
        torch_cls(3)(x)
    with pytest.raises(ValueError) as err:
        ours_cls(3)(x)
    assert str(err.value) == str(ref_err.value)  # e.g. "expected 4D input (got 3D input)"


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("kwargs", [{}, {"track_running_stats": False}, {"affine": False}], ids=str)
def test_wrong_channel_count_raises_before_any_update(training, kwargs):
    m = normlab.nn.BatchNorm2d(3, **kwargs).train(training)
    with pytest.raises(RuntimeError):  # the oracle's class
        nn.BatchNorm2d(3, **kwargs).train(training)(torch.randn(2, 4, 3, 3))
    before = copy.deepcopy(m.state_dict())
    with pytest.raises(RuntimeError, match=r"expected input with 3 channels.*got input of shape \[2, 4, 3, 3\] with 4 channels"):
        m(torch.randn(2, 4, 3, 3))
    after = m.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # num_batches_tracked too


def test_no_per_channel_state_accepts_any_channel_count_like_torch():
    """affine=False, track_running_stats=False holds nothing per channel; torch accepts any C."""
    ours = normlab.nn.BatchNorm2d(3, affine=False, track_running_stats=False)
    ref = nn.BatchNorm2d(3, affine=False, track_running_stats=False)
    x = _x((2, 5, 2, 2), seed=3)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)


def test_integer_input_raises_not_implemented():
    x = torch.ones(2, 3, 4, 4, dtype=torch.long)
    with pytest.raises(NotImplementedError):
        nn.BatchNorm2d(3)(x)
    with pytest.raises(NotImplementedError, match=r"floating-point.*torch\.int64"):
        normlab.nn.BatchNorm2d(3)(x)


@pytest.mark.parametrize("shape", [(1, 3), (1, 3, 1)])
def test_one_value_per_channel_in_training_raises_torchs_error(shape):
    x = torch.randn(shape)
    with pytest.raises(ValueError) as ref_err:
        nn.BatchNorm1d(3)(x)
    m = normlab.nn.BatchNorm1d(3)
    with pytest.raises(ValueError) as err:
        m(x)
    assert str(err.value) == str(ref_err.value)
    assert int(m.num_batches_tracked) == 0  # a rejected batch is not counted


def test_mixed_float64_input_float32_module_raises():
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    with pytest.raises(RuntimeError):
        nn.BatchNorm1d(3)(x)
    with pytest.raises(RuntimeError, match="mixed dtype"):
        normlab.nn.BatchNorm1d(3)(x)


def test_weight_of_wrong_shape_raises():
    """A weight swapped for one of the wrong size is caught with what was expected."""
    m, ref = normlab.nn.BatchNorm1d(3), nn.BatchNorm1d(3)
    m.weight = nn.Parameter(torch.ones(4))
    ref.weight = nn.Parameter(torch.ones(4))
    x = torch.randn(4, 3)
    with pytest.raises(RuntimeError):
        ref(x)
    with pytest.raises(RuntimeError, match=r"expected weight of shape \[3\].*got weight of shape \[4\]"):
        m(x)


# Shapes that reach each way the "cpu" kernels gather a channel's statistics: (N, C) rows,
# short planes (S < 256: per-column sums), planes of >= 256 values (plane by plane),
# channels-last rows, and a batch large enough to be split into row groups.
_INF_CASES = [
    ((16, 4), False),
    ((4, 3, 100), False),
    ((2, 3, 16, 16), False),
    ((4, 3, 4, 4), True),
    ((2048, 3), False),
    ((4, 3, 32, 32), False),
]


@pytest.mark.parametrize("backend", ["cpu", "ref"])
@pytest.mark.parametrize("shape,channels_last", _INF_CASES)
@pytest.mark.parametrize("values", [("inf", None), ("-inf", None), ("inf", "-inf"), ("inf", "nan")])
@pytest.mark.parametrize("where", ["first", "last"])
def test_infinite_input_gives_torchs_running_mean(backend, shape, channels_last, values, where):
    """torch's batch mean is sum / count: +-inf for a channel holding infinities of one
    sign, NaN with a NaN or both signs; the running mean takes it. The shifted statistics
    would give NaN for an infinity (inf - inf) -- also when it is the channel's first value."""
    torch_cls = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d}[len(shape)]
    ours_cls = {2: normlab.nn.BatchNorm1d, 3: normlab.nn.BatchNorm1d, 4: normlab.nn.BatchNorm2d}[len(shape)]
    x = _x(shape, seed=11)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    first = (0, 1) + (0,) * (len(shape) - 2)
    last = (shape[0] - 1, 1) + tuple(s - 1 for s in shape[2:])
    spots = [first, last] if where == "first" else [last, first]
    with torch.no_grad():
        for spot, v in zip(spots, values):
            if v is not None:
                x[spot] = float(v)
    ref = torch_cls(shape[1])
    ours = ours_cls(shape[1])
    xo, xt = x.clone().requires_grad_(), x.clone().requires_grad_()
    with normlab.use_backend(backend):
        y = ours(xo)
    yt = ref(xt)
    torch.testing.assert_close(ours.running_mean, ref.running_mean, equal_nan=True)
    torch.testing.assert_close(ours.running_var, ref.running_var, equal_nan=True)
    assert torch.equal(y.isnan(), yt.isnan())
    torch.testing.assert_close(y, yt, equal_nan=True, rtol=1e-5, atol=1e-5)
    # db = sum of dy stays finite in torch whatever x holds; dw and dx of the channel are NaN
    dy = torch.randn(yt.shape, generator=torch.Generator().manual_seed(5))
    with normlab.use_backend(backend):
        y.backward(dy)
    yt.backward(dy)
    assert torch.isfinite(ours.bias.grad).all()
    for a, b in ((xo.grad, xt.grad), (ours.weight.grad, ref.weight.grad), (ours.bias.grad, ref.bias.grad)):
        torch.testing.assert_close(a, b, equal_nan=True, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(8, 64, 16, 16), (4, 16, 2, 40, 40)])
def test_running_mean_of_zero_mean_planes_within_rounding(dtype, shape):
    """Planes of >= 256 values: the running mean of channels whose mean is near 0 (the usual
    case after a convolution) is within 2x its float32 rounding error of the float64 answer.
    (Float32 sums of the shifted values left it at 30-200x; torch's double sums: 1.3-6x.)"""
    cls = normlab.nn.BatchNorm2d if len(shape) == 4 else normlab.nn.BatchNorm3d
    ref_cls = nn.BatchNorm2d if len(shape) == 4 else nn.BatchNorm3d
    x = torch.randn(shape, generator=torch.Generator().manual_seed(7)).to(dtype)
    ours, ref = cls(shape[1]), ref_cls(shape[1], dtype=torch.float64)
    ours(x)
    ref(x.double())
    assert_within_rounding(ours.running_mean, ref.running_mean, what="running_mean")
    assert_within_rounding(ours.running_var, ref.running_var, what="running_var")
