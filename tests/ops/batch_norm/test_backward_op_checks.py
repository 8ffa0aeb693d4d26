"""The BatchNorm backward op checks its arguments itself: a call through ``torch.ops.normlab`` (as a
compiled graph makes it) with a gradient of another shape than the input raises, naming both
shapes, instead of reading the gradient with the input's geometry."""

from __future__ import annotations

import pytest
import torch

import normlab.ops.extension as extension

pytestmark = pytest.mark.skipif(extension.load() is None, reason="the C++ extension is not built")


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("dy_shape", [(7, 3, 5), (6, 3, 4), (6, 15)])
def test_a_gradient_of_another_shape_is_refused(training, dy_shape):
    x, w = torch.randn(6, 3, 5), torch.rand(3) + 0.5
    _, stats = torch.ops.normlab.batch_norm_fwd(x, w, None, 1e-5)
    dy = torch.randn(dy_shape)  # as many values as x, or more: never read past its end
    with pytest.raises(RuntimeError, match=r"expected a gradient of shape \[6, 3, 5\], got \[" +
                       ", ".join(map(str, dy_shape)) + r"\]"):
        torch.ops.normlab.batch_norm_bwd(dy, x, w, stats, training, True, True)


def test_a_gradient_of_the_input_shape_is_taken():
    """The check refuses nothing it should take: dy of x's shape gives eval's dx = dy * w * rstd."""
    x, w = torch.randn(6, 3, 5, dtype=torch.float64), torch.rand(3, dtype=torch.float64) + 0.5
    _, stats = torch.ops.normlab.batch_norm_fwd(x, w, None, 1e-5)
    dy = torch.randn(6, 3, 5, dtype=torch.float64)
    dx, _, _ = torch.ops.normlab.batch_norm_bwd(dy, x, w, stats, False, True, False)
    var = x.var(dim=(0, 2), unbiased=False)
    want = dy * (w / torch.sqrt(var + 1e-5)).reshape(1, 3, 1)
    torch.testing.assert_close(dx, want, rtol=1e-12, atol=1e-12)
