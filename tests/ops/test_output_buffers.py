"""The kernels' output buffers (``ops/_launch.empty_like``): torch.empty_like's tensor, with
large buffers advised onto transparent huge pages."""

import pytest
import torch

import normlab.functional as F
from normlab.ops import _launch


@pytest.fixture
def advice(monkeypatch):
    """Record the madvise calls instead of making them."""
    calls = []
    monkeypatch.setattr(_launch, "_madvise", lambda addr, length, advice: calls.append((addr, length, advice)) or 0)
    return calls


@pytest.mark.parametrize("memory_format", [torch.preserve_format, torch.contiguous_format])
@pytest.mark.parametrize("shape", [(4, 6), (8, 64, 32, 32), (3, 1 << 20)])
def test_same_tensor_as_torch(advice, shape, memory_format):
    x = torch.randn(shape).contiguous(memory_format=torch.channels_last) if len(shape) == 4 else torch.randn(shape)
    out, ref = _launch.empty_like(x, memory_format=memory_format), torch.empty_like(x, memory_format=memory_format)
    assert (out.shape, out.dtype, out.stride(), out.device) == (ref.shape, ref.dtype, ref.stride(), ref.device)


def test_large_buffers_are_advised_inside_their_own_pages(advice):
    for dtype, numel in [(torch.float32, 1 << 20), (torch.bfloat16, 3 << 20), (torch.float64, 1_000_003)]:
        advice.clear()
        out = _launch.empty_like(torch.empty(numel, dtype=dtype))
        start, end = out.data_ptr(), out.data_ptr() + out.numel() * out.element_size()
        assert len(advice) == 1
        addr, length, kind = advice[0]
        assert kind == 14  # MADV_HUGEPAGE
        assert addr % 4096 == 0 and length % 4096 == 0 and length > 0
        assert start <= addr and addr + length <= end  # whole pages of this buffer only
        assert addr - start < 4096 and end - (addr + length) < 4096  # and all of them


def test_small_buffers_are_not_advised(advice):
    _launch.empty_like(torch.empty((1 << 20) - 1))  # one float short of 4 MiB
    _launch.empty_like(torch.empty(16, 16))
    assert advice == []


def test_advice_can_be_switched_off(monkeypatch):
    monkeypatch.setattr(_launch, "_madvise", None)
    monkeypatch.setenv("NORMLAB_HUGEPAGES", "0")
    assert _launch._huge_pages() is False


def test_kernel_outputs_are_advised_and_correct(advice):
    x = torch.randn(1024, 1024)  # a 4 MiB output
    w, b = torch.randn(1024), torch.randn(1024)
    y = F.layer_norm(x, (1024,), w, b)
    assert len(advice) == 1
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (1024,), w, b))
