"""torch.func transforms and forward-mode AD on every normlab op, both backends.

Oracle: the same transform applied to torch.nn.functional's op, float64, 1e-9.
"""

from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch.func import functional_call, grad, hessian, jacfwd, jacrev, jvp, stack_module_state, vmap

import normlab
import normlab.functional as NF
from tests.oracle import ops_dispatched

D = torch.float64
BACKENDS = ["ref", "cpu"]


def _families():
    """name -> (normlab op, torch op, input shape); every op takes (x, w, b) with (4,) w and b."""
    g = torch.Generator().manual_seed(7)
    rm = torch.randn(4, dtype=D, generator=g)
    rv = torch.rand(4, dtype=D, generator=g) + 0.5
    return {
        "layer_norm": (lambda x, w, b: NF.layer_norm(x, (4,), w, b), lambda x, w, b: F.layer_norm(x, (4,), w, b),
                       (3, 5, 4)),
        "rms_norm": (lambda x, w, b: NF.rms_norm(x, (4,), w, 1e-6) + b,
                     lambda x, w, b: F.rms_norm(x, (4,), w, 1e-6) + b, (3, 5, 4)),
        "add_layer_norm": (lambda x, w, b: NF.add_layer_norm(x, 0.5 * x, (4,), w, b)[0],
                           lambda x, w, b: F.layer_norm(x + 0.5 * x, (4,), w, b), (3, 5, 4)),
        "add_rms_norm": (lambda x, w, b: NF.add_rms_norm(x, 0.5 * x, (4,), w, 1e-6)[0] + b,
                         lambda x, w, b: F.rms_norm(x + 0.5 * x, (4,), w, 1e-6) + b, (3, 5, 4)),
        "batch_norm_train": (lambda x, w, b: NF.batch_norm(x, None, None, w, b, True),
                             lambda x, w, b: F.batch_norm(x, None, None, w, b, True), (6, 4, 3)),
        "batch_norm_eval": (lambda x, w, b: NF.batch_norm(x, rm, rv, w, b, False),
                            lambda x, w, b: F.batch_norm(x, rm, rv, w, b, False), (6, 4, 3)),
        "group_norm": (lambda x, w, b: NF.group_norm(x, 2, w, b), lambda x, w, b: F.group_norm(x, 2, w, b),
                       (3, 4, 5)),
        "instance_norm_train": (lambda x, w, b: NF.instance_norm(x, None, None, w, b, True),
                                lambda x, w, b: F.instance_norm(x, None, None, w, b, True), (3, 4, 5)),
        "instance_norm_eval": (lambda x, w, b: NF.instance_norm(x, rm, rv, w, b, False),
                               lambda x, w, b: F.instance_norm(x, rm, rv, w, b, False), (3, 4, 5)),
    }


FAMILIES = list(_families())


def _args(shape, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, dtype=D, generator=g) * 2 + 0.5
    return x, torch.randn(4, dtype=D, generator=g), torch.randn(4, dtype=D, generator=g)


def _loss(f):
    return lambda x, w, b: (f(x, w, b) ** 3).sum()


TRANSFORMS = {
    "vmap": lambda f, x, w, b: vmap(f, in_dims=(0, None, None))(torch.stack([x, x.flip(0) * 0.5]), w, b),
    "vmap_in_dims_last": lambda f, x, w, b: vmap(f, in_dims=(-1, None, None))(torch.stack([x, x * 2], -1), w, b),
    "vmap_batched_params": lambda f, x, w, b: vmap(f, in_dims=(None, 0, 0))(x, torch.stack([w, -w]),
                                                                           torch.stack([b, b + 1])),
    "vmap_nested": lambda f, x, w, b: vmap(vmap(f, in_dims=(0, None, None)), in_dims=(0, 0, None))(
        torch.stack([torch.stack([x, 2 * x])] * 2), torch.stack([w, 3 * w]), b),
    "grad": lambda f, x, w, b: grad(_loss(f), argnums=(0, 1, 2))(x, w, b),
    "jvp": lambda f, x, w, b: jvp(f, (x, w, b), (torch.cos(x), torch.sin(w), torch.cos(b))),
    "jacrev": lambda f, x, w, b: jacrev(f, argnums=(0, 1, 2))(x, w, b),
    "jacfwd": lambda f, x, w, b: jacfwd(f, argnums=(0, 1, 2))(x, w, b),
    "hessian": lambda f, x, w, b: hessian(_loss(f), argnums=(0, 1))(x, w, b),
    "vmap_grad": lambda f, x, w, b: vmap(grad(lambda xi, w, b: _loss(f)(xi.unsqueeze(0), w, b), argnums=(0, 1)),
                                         in_dims=(0, None, None))(x, w, b),
}
# the per-sample gradient of a norm whose statistics run over the batch has no sample of its own
PER_SAMPLE_NEEDS_ROWS = {"batch_norm_train"}


def _flatten(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in _flatten(o)]


def _plain(x, dims, w, b, eps, center=True, mean=None, var=None, shape=None):
    """A norm in elementary torch ops (autograd differentiates it op by op): over ``dims``, or with
    fixed ``mean``/``var``; ``w``/``b`` reshaped to ``shape``."""
    if mean is None:
        mean = x.mean(dims, keepdim=True) if center else 0.0
        var = ((x - mean) ** 2).mean(dims, keepdim=True)
    y = (x - mean) / torch.sqrt(var + eps)
    return y * w.reshape(shape) + b.reshape(shape)


def _grouped_plain(x, w, b, groups):
    n, c = x.shape[:2]
    xg = x.reshape(n, groups, -1)
    y = _plain(xg, (2,), torch.ones(1, dtype=D), torch.zeros(1, dtype=D), 1e-5, shape=(1,))
    return y.reshape(x.shape) * w.reshape(1, c, 1) + b.reshape(1, c, 1)


def _elementary():
    """name -> the same op in elementary torch ops: the oracle of second derivatives.

    torch 2.13's own forward-over-reverse derivative of its fused layer_norm and batch_norm
    is wrong in the mixed (input, weight) block: for LayerNorm, jvp(jacrev(f, argnums=w))
    along x gives [21.50, 23.50, 2.46, -0.61] where central differences of the gradient give
    [15.14, 5.64, 3.74, -0.39] (and normlab, and these formulas, give the latter); so the
    Hessians are checked against these.
    """
    g = torch.Generator().manual_seed(7)
    rm = torch.randn(4, dtype=D, generator=g)
    rv = torch.rand(4, dtype=D, generator=g) + 0.5
    ch = (1, 4, 1)
    return {
        "layer_norm": lambda x, w, b: _plain(x, (-1,), w, b, 1e-5, shape=(4,)),
        "rms_norm": lambda x, w, b: _plain(x, (-1,), w, b, 1e-6, center=False, shape=(4,)),
        "add_layer_norm": lambda x, w, b: _plain(1.5 * x, (-1,), w, b, 1e-5, shape=(4,)),
        "add_rms_norm": lambda x, w, b: _plain(1.5 * x, (-1,), w, b, 1e-6, center=False, shape=(4,)),
        "batch_norm_train": lambda x, w, b: _plain(x, (0, 2), w, b, 1e-5, shape=ch),
        "batch_norm_eval": lambda x, w, b: _plain(x, (0, 2), w, b, 1e-5, mean=rm.reshape(ch), var=rv.reshape(ch),
                                                  shape=ch),
        "group_norm": lambda x, w, b: _grouped_plain(x, w, b, 2),
        "instance_norm_train": lambda x, w, b: _plain(x, (2,), w, b, 1e-5, shape=ch),
        "instance_norm_eval": lambda x, w, b: _plain(x, (2,), w, b, 1e-5, mean=rm.reshape(ch), var=rv.reshape(ch),
                                                     shape=ch),
    }


def test_second_derivative_oracle_against_finite_differences():
    """The elementary-ops oracle's mixed second derivative is the true one (central differences)."""
    f = _elementary()["layer_norm"]
    x, w, b = _args((3, 4), 11)
    v = torch.randn(3, 4, dtype=D)

    def grad_w(xx):
        ww = w.clone().requires_grad_()
        return torch.autograd.grad((f(xx, ww, b) ** 3).sum(), ww)[0]

    h = 1e-6
    fd = (grad_w(x + h * v) - grad_w(x - h * v)) / (2 * h)
    exact = jvp(lambda xx: grad(_loss(f), argnums=1)(xx, w, b), (x,), (v,))[1]
    torch.testing.assert_close(exact, fd, rtol=1e-6, atol=1e-6)
    with normlab.use_backend("cpu"):
        ours = jvp(lambda xx: jacrev(_loss(_families()["layer_norm"][0]), argnums=1)(xx, w, b), (x,), (v,))[1]
    torch.testing.assert_close(ours, fd, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transform", list(TRANSFORMS))
@pytest.mark.parametrize("family", FAMILIES)
def test_transform_matches_torch(family, transform, backend):
    ours, theirs, shape = _families()[family]
    if transform == "hessian":
        theirs = _elementary()[family]
    if transform == "vmap_grad" and family in PER_SAMPLE_NEEDS_ROWS:
        pytest.skip("training BatchNorm of one sample: torch raises for it too")
    if transform in ("jacrev", "jacfwd", "hessian"):
        shape = (2,) + shape[1:]  # small Jacobians
    x, w, b = _args(shape, hash((family, transform)) % 1000)
    tf = TRANSFORMS[transform]
    with normlab.use_backend(backend):
        got = _flatten(tf(ours, x, w, b))
    want = _flatten(tf(theirs, x, w, b))
    assert len(got) == len(want)
    for g, t in zip(got, want):
        torch.testing.assert_close(g, t, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_forward_mode_ad(family, backend):
    ours, theirs, shape = _families()[family]
    x, w, b = _args(shape, 3)
    tx, tw, tb = _args(shape, 4)
    with fwAD.dual_level():
        duals = [fwAD.make_dual(p, t) for p, t in ((x, tx), (w, tw), (b, tb))]
        with normlab.use_backend(backend):
            got = fwAD.unpack_dual(ours(*duals))
        want = fwAD.unpack_dual(theirs(*duals))
    torch.testing.assert_close(got.primal, want.primal, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(got.tangent, want.tangent, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("family", ["layer_norm", "batch_norm_train", "batch_norm_eval", "group_norm",
                                    "instance_norm_eval"])
@pytest.mark.parametrize("batched_params", [False, True])
def test_vmap_runs_one_kernel_call(family, batched_params):
    """A vmapped call maps the batch onto the op: one forward kernel call (one ``normlab::`` op
    dispatched, besides a running-statistics update), whatever the batch."""
    ours, theirs, shape = _families()[family]
    x = torch.randn((7,) + shape, dtype=D)
    w, b = torch.randn(7, 4, dtype=D), torch.randn(7, 4, dtype=D)
    dims = (0, 0, 0) if batched_params else (0, None, None)
    args = (x, w, b) if batched_params else (x, w[0], b[0])
    got = []
    with normlab.use_backend("cpu"):
        ops, err = ops_dispatched(lambda: got.append(vmap(ours, in_dims=dims)(*args)))
    assert err is None
    kernels = [op for op in ops if op.startswith("normlab.") and "update" not in op]
    assert len(kernels) == 1, ops
    got = got[0]
    torch.testing.assert_close(got, vmap(theirs, in_dims=dims)(*args), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_norm_running_statistics_under_vmap(backend):
    """Batched buffers update per member, as torch's; unbatched buffers with a batched input raise."""
    x = torch.randn(3, 8, 4, dtype=D)
    rm, rv = torch.randn(3, 4, dtype=D), torch.rand(3, 4, dtype=D) + 0.5
    trm, trv = rm.clone(), rv.clone()
    with normlab.use_backend(backend):
        y = vmap(lambda x, m, v: NF.batch_norm(x, m, v, training=True, momentum=0.3))(x, rm, rv)
    ty = vmap(lambda x, m, v: F.batch_norm(x, m, v, training=True, momentum=0.3))(x, trm, trv)
    torch.testing.assert_close(y, ty, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(rm, trm, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rv, trv, rtol=1e-12, atol=1e-12)
    with normlab.use_backend(backend), pytest.raises(RuntimeError, match="running_mean or running_var"):
        vmap(lambda x: NF.batch_norm(x, rm[0], rv[0], training=True))(x)


def _model(ctor):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.GroupNorm(2, 4),
        torch.nn.Flatten(1), torch.nn.Linear(4 * 5 * 5, 8), torch.nn.LayerNorm(8), torch.nn.RMSNorm(8),
        torch.nn.Linear(8, 3),
    ).to(D)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ensemble_with_stack_module_state(backend):
    """The ensemble recipe: stack_module_state + functional_call + vmap, normlab against torch.nn."""
    members = [_model(None) for _ in range(3)]
    for k, m in enumerate(members):
        for p in m.parameters():
            p.data.add_(0.1 * k)
    ours = [normlab.convert(_model(None)) for _ in range(3)]
    for o, m in zip(ours, members):
        o.load_state_dict(m.state_dict())
    x = torch.randn(3, 6, 2, 5, 5, dtype=D)  # a batch per member

    def run(models):
        params, buffers = stack_module_state(models)
        base = models[0]

        def f(p, bf, xi):
            return functional_call(base, (p, bf), (xi,))

        out = vmap(f)(params, buffers, x)
        grads = torch.autograd.grad(out.pow(2).sum(), list(params.values()))
        return out, grads, buffers

    with normlab.use_backend(backend):
        out, grads, bufs = run(ours)
    t_out, t_grads, t_bufs = run(members)
    torch.testing.assert_close(out, t_out, rtol=1e-9, atol=1e-9)
    for g, t in zip(grads, t_grads):
        torch.testing.assert_close(g, t, rtol=1e-9, atol=1e-9)
    for k in t_bufs:
        torch.testing.assert_close(bufs[k], t_bufs[k], rtol=1e-12, atol=1e-12)
