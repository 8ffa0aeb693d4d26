"""torch.func.vmap over stacked LayerNorm/RMSNorm weights: the rows of every member in one
kernel call with *grouped* weights (row i takes weight row i // rows), forward and backward.

Oracles: torch.nn.functional in float64, member by member; and normlab's own unbatched call
on each member, which the grouped kernel must reproduce bit for bit (the same arithmetic per
row, the same chunks for dw/db)."""

import pytest
import torch
import torch.nn.functional as F
from torch.func import vmap

import normlab
import normlab.functional as NF

B, R, C = 4, 37, 24  # members, rows per member (not a multiple of a chunk), columns


def _members(dtype, seed=0, rows=R, cols=C):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(B, rows, cols, generator=g, dtype=torch.float64) * 2 + 0.5).to(dtype)
    w = torch.randn(B, cols, generator=g, dtype=torch.float64).to(dtype)
    b = torch.randn(B, cols, generator=g, dtype=torch.float64).to(dtype)
    dy = torch.randn(B, rows, cols, generator=g, dtype=torch.float64).to(dtype)
    return x, w, b, dy


NORMS = {
    "layer_norm": (lambda x, w, b: NF.layer_norm(x, (x.shape[-1],), w, b),
                   lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b)),
    "rms_norm": (lambda x, w, b: NF.rms_norm(x, (x.shape[-1],), w, 1e-6),
                 lambda x, w, b: F.rms_norm(x, (x.shape[-1],), w, 1e-6)),
    "rms_norm_gemma": (lambda x, w, b: NF.rms_norm(x, (x.shape[-1],), w, 1e-6, casting="gemma", offset=1.0),
                       lambda x, w, b: (F.rms_norm(x.double(), (x.shape[-1],), None, 1e-6)
                                        * (1.0 + w.double())).to(x.dtype)),
    "rms_norm_llama": (lambda x, w, b: NF.rms_norm(x, (x.shape[-1],), w, 1e-6, casting="llama"),
                       lambda x, w, b: w * F.rms_norm(x.double(), (x.shape[-1],), None, 1e-6).to(x.dtype)),
}


def _run(f, x, w, b, dy, batched):
    x, w, b = (t.detach().clone().requires_grad_() for t in (x, w, b))
    if batched:
        y = vmap(f)(x, w, b)
    else:
        y = torch.stack([f(x[i], w[i], b[i]) for i in range(B)])
    grads = torch.autograd.grad(y, (x, w, b), dy, allow_unused=True, materialize_grads=True)
    return (y,) + grads


@pytest.mark.parametrize("name", list(NORMS))
def test_matches_torch_member_by_member_in_float64(name):
    ours, theirs = NORMS[name]
    x, w, b, dy = _members(torch.float64)
    with normlab.use_backend("cpu"):
        got = _run(ours, x, w, b, dy, batched=True)
    want = _run(theirs, x, w, b, dy, batched=False)
    for g, t in zip(got, want):
        torch.testing.assert_close(g, t, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(NORMS))
def test_same_bits_as_each_member_alone(name, dtype):
    ours, _ = NORMS[name]
    x, w, b, dy = _members(dtype, seed=1)
    with normlab.use_backend("cpu"):
        got = _run(ours, x, w, b, dy, batched=True)
        alone = _run(ours, x, w, b, dy, batched=False)
    for g, a in zip(got, alone):
        assert torch.equal(g, a)


def test_unbatched_weight_next_to_batched_bias():
    x, w, b, dy = _members(torch.float64, seed=2)
    with normlab.use_backend("cpu"):
        y = vmap(lambda x, b: NF.layer_norm(x, (C,), w[0], b), in_dims=(0, 0))(x, b)
    want = torch.stack([F.layer_norm(x[i], (C,), w[0], b[i]) for i in range(B)])
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)


def test_same_bits_on_one_and_two_threads():
    """Large enough for the parallel kernels: the grouped chunks do not depend on threads."""
    x, w, b, dy = _members(torch.float32, seed=3, rows=300, cols=64)
    ours, _ = NORMS["layer_norm"]
    old = torch.get_num_threads()
    try:
        outs = []
        for n in (1, 2):
            torch.set_num_threads(n)
            with normlab.use_backend("cpu"):
                outs.append(_run(ours, x, w, b, dy, batched=True))
    finally:
        torch.set_num_threads(old)
    for a, c in zip(*outs):
        assert torch.equal(a, c)


def test_weight_gradients_have_the_stacked_shape():
    x, w, b, dy = _members(torch.float32, seed=4)
    with normlab.use_backend("cpu"):
        _, gx, gw, gb = _run(NORMS["layer_norm"][0], x, w, b, dy, batched=True)
    assert gx.shape == x.shape and gw.shape == w.shape == gb.shape
