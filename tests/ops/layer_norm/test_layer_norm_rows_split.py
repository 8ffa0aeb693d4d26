"""The LayerNorm row kernel's choices from the shape (``csrc/cpu/layer_norm_kernels.cpp``): the
output streamed past the caches for tensors larger than half the last-level cache, a task's half
precision weight widened to float32 once it has many rows, tasks of a few rows at 2 threads. None
of them may change a bit: each result equals the same rows computed as a small tensor (not
streamed, not widened, one task), and the output is within 8x the error of rounding the float64
result (two passes in float64 from the same float32 input) at mean 1e4.
"""

from __future__ import annotations

import pytest
import torch

import normlab
import normlab.functional as NF
from tests.oracle import assert_within_rounding


def _ln(x, w, b):
    with torch.no_grad(), normlab.use_backend("cpu"):
        return NF.layer_norm(x, x.shape[-1:], w, b)


def _by_slices(x, w, b, rows):
    return torch.cat([_ln(x[i : i + rows], w, b) for i in range(0, x.shape[0], rows)])


def _params(n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (1 + 0.5 * torch.randn(n, generator=g)).to(dtype), (0.5 * torch.randn(n, generator=g)).to(dtype)


@pytest.mark.parametrize(
    "shape,dtype", [((4099, 1000), torch.float32), ((2049, 4099), torch.bfloat16), ((6345, 1781), torch.float16)], ids=str
)
def test_streamed_output_same_bits_as_small_calls(shape, dtype):
    """x and y over 32 MiB (rows of 1000 float32: every other row starts off a cache line; 4099
    bfloat16: odd rows; 1781 float16, rows under 4 KiB streamed past the whole last level: rows
    start anywhere in a line, and a line holds the end of one row and the start of the next),
    against 16-row calls of a few hundred KiB."""
    g = torch.Generator().manual_seed(1)
    x = (3 + torch.randn(shape, generator=g)).to(dtype)
    w, b = _params(shape[1], dtype, 2)
    assert torch.equal(_ln(x, w, b), _by_slices(x, w, b, 16))


def test_streamed_output_large_mean_within_8x_rounding_of_float64():
    g = torch.Generator().manual_seed(3)
    x = (1e4 + torch.randn(4099, 1000, generator=g, dtype=torch.float64)).float()
    w, b = _params(1000, torch.float32, 4)
    x64 = x.double()
    mean = x64.mean(-1, keepdim=True)
    var = ((x64 - mean) ** 2).mean(-1, keepdim=True)
    y64 = (x64 - mean) / torch.sqrt(var + 1e-5) * w.double() + b.double()
    assert_within_rounding(_ln(x, w, b), y64, 8.0, "y")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("threads", [1, 2])
def test_widened_half_weight_same_bits(dtype, threads):
    """256 rows a call (tasks of 128-256 rows widen the weight) against 8-row calls (they do not)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(256, 4096, generator=g).to(dtype)
    w, b = _params(4096, dtype, 6)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        assert torch.equal(_ln(x, w, b), _by_slices(x, w, b, 8))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("rows,cols", [(8, 4096), (3, 8192), (2, 8193)])
def test_few_wide_rows_same_bits_for_1_and_2_threads(rows, cols):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(rows, cols, generator=g)
    w, b = _params(cols, torch.float32, 8)
    before = torch.get_num_threads()
    try:
        out = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            out.append(_ln(x, w, b))
        assert torch.equal(out[0], out[1])
    finally:
        torch.set_num_threads(before)
