"""normlab.convert / revert for LocalResponseNorm, CrossMapLRN2d and the Lazy modules (converted
once materialised), and the Lazy modules in the norm-layer finders."""

from __future__ import annotations

import torch

import normlab
from normlab.tools.norm_layers import batch_norm_rank, norm_family


def test_lrn_modules_convert_and_revert_with_the_same_outputs():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 1), torch.nn.LocalResponseNorm(3, 1e-2, 0.5, 2.0),
                                torch.nn.CrossMapLRN2d(5, 1e-3, 0.75, 1))
    x = torch.randn(2, 3, 4, 4)
    want = model(x)
    model = normlab.convert(model)
    assert type(model[1]) is normlab.nn.LocalResponseNorm and type(model[2]) is normlab.nn.CrossMapLRN2d
    assert repr(model[1]) == "LocalResponseNorm(3, alpha=0.01, beta=0.5, k=2.0)"
    torch.testing.assert_close(model(x), want)
    model = normlab.revert(model)
    assert type(model[1]) is torch.nn.LocalResponseNorm and type(model[2]) is torch.nn.CrossMapLRN2d
    torch.testing.assert_close(model(x), want)


def test_lazy_modules_are_converted_once_materialised():
    model = torch.nn.Sequential(torch.nn.LazyBatchNorm2d(), torch.nn.LazyInstanceNorm2d())
    assert normlab.convert(model) is model
    assert type(model[0]) is torch.nn.LazyBatchNorm2d  # left alone before the first call
    x = torch.randn(2, 3, 4, 4)
    model(x)  # the dry run: torch's BatchNorm2d and InstanceNorm2d now
    w = model[0].weight
    model = normlab.convert(model)
    assert type(model[0]) is normlab.nn.BatchNorm2d and model[0].weight is w
    assert type(model[1]) is normlab.nn.InstanceNorm2d and model[1].num_features == 3


def test_unmaterialised_lazy_modules_are_no_norm_layers_yet():
    for m in (torch.nn.LazyBatchNorm1d(), normlab.nn.LazyBatchNorm1d(), normlab.nn.LazyInstanceNorm2d()):
        assert batch_norm_rank(m) is None and norm_family(m) is None
    m = normlab.nn.LazyBatchNorm1d()
    m(torch.randn(4, 3))
    assert batch_norm_rank(m) == 1 and norm_family(m) == "batch"
    assert type(normlab.revert(m)) is torch.nn.BatchNorm1d
