"""normlab.nn.LocalResponseNorm and CrossMapLRN2d beside torch.nn's (the oracle): signature,
defaults, repr, state_dict, values (the math itself: tests/ops/local_response_norm)."""

from __future__ import annotations

import inspect

import pytest
import torch

import normlab


@pytest.mark.parametrize("name", ["LocalResponseNorm", "CrossMapLRN2d"])
def test_signature_repr_and_empty_state_as_torch(name):
    ours, theirs = getattr(normlab.nn, name), getattr(torch.nn, name)
    def params(c):
        return [(p.name, p.default, p.kind) for p in inspect.signature(c.__init__).parameters.values()]

    assert params(ours) == params(theirs)
    for args in [(3,), (2, 1e-3, 0.5, 2.0), (4, 1, 1, 1)]:
        assert repr(ours(*args)) == repr(theirs(*args))
        assert ours(*args).state_dict() == theirs(*args).state_dict() == {}
        assert list(ours(*args).parameters()) == []


@pytest.mark.parametrize("shape", [(2, 5, 7), (2, 5, 3, 4), (2, 5, 2, 2, 3)])
@pytest.mark.parametrize("size", [1, 2, 5, 7])
def test_local_response_norm_module_matches_torch(shape, size):
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    y, t = normlab.nn.LocalResponseNorm(size)(x), torch.nn.LocalResponseNorm(size)(x)
    torch.testing.assert_close(y, t)
    torch.testing.assert_close(torch.autograd.grad(y.sum(), x)[0], torch.autograd.grad(t.sum(), x)[0])


def test_cross_map_module_matches_torch_forward():
    x = torch.randn(2, 6, 3, 3, dtype=torch.float64)
    torch.testing.assert_close(normlab.nn.CrossMapLRN2d(3)(x), torch.nn.CrossMapLRN2d(3)(x))
