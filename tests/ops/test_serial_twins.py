"""The serial twins of the cpu kernels (``ops/_jit.serial``): same source, same bits.

Small tensors, one-thread runs and forked children run every kernel through its
serial twin; large tensors on several threads through the parallel version. The
two must give the same bits for the same input, on either side of the size
threshold -- checked here at the threshold itself, by forcing each version on
the same tensors.
"""

from __future__ import annotations

import pytest
import torch

import normlab
import normlab.functional as NF
from normlab.ops import _jit, _launch

pytestmark = pytest.mark.skipif(not _launch.available(), reason="numba not installed")

N_AT = _launch.SERIAL_ELEMS  # values in each input below: exactly the threshold


def _leaf(shape, dtype, gen):
    return torch.randn(shape, generator=gen).to(dtype).requires_grad_()


def _run_all(dtype, parallel: bool):
    """Every op, forward and backward, in one kernel version; returns every output and gradient."""
    gen = torch.Generator().manual_seed(7)
    outs = []
    with normlab.use_backend("cpu"), _launch.forced_version(parallel):
        # rows: (64, 512) -- LayerNorm, RMSNorm, the fused add
        x, r = _leaf((64, 512), dtype, gen), _leaf((64, 512), dtype, gen)
        w, b = _leaf((512,), dtype, gen), _leaf((512,), dtype, gen)
        y1 = NF.layer_norm(x, (512,), w, b)
        y2 = NF.rms_norm(x, (512,), w)
        y3, h = NF.add_layer_norm(x, r, (512,), w, b)
        dy = torch.randn(64, 512, generator=gen).to(dtype)
        torch.autograd.backward([y1, y2, y3, h], [dy, dy, dy, dy])
        outs += [y1, y2, y3, h, x.grad, r.grad, w.grad, b.grad]
        # BatchNorm: planes (32, 4, 16, 16), rows (512, 64), channels_last
        for shape, fmt in (((32, 4, 16, 16), torch.contiguous_format), ((512, 64), None),
                           ((32, 4, 16, 16), torch.channels_last)):
            x = torch.randn(shape, generator=gen).to(dtype)
            if fmt is not None:
                x = x.contiguous(memory_format=fmt)
            x.requires_grad_()
            c = shape[1]
            w, b = _leaf((c,), dtype, gen), _leaf((c,), dtype, gen)
            rm, rv = torch.zeros(c), torch.ones(c)
            y = NF.batch_norm(x, rm, rv, w, b, training=True)
            y.backward(torch.randn(shape, generator=gen).to(dtype))
            ye = NF.batch_norm(x.detach(), rm, rv, w.detach(), b.detach(), training=False)
            outs += [y, x.grad, w.grad, b.grad, rm, rv, ye]
        # GroupNorm NCHW and S == 1 (the NHWC kernels), InstanceNorm
        for shape, groups in (((16, 32, 8, 8), 8), ((512, 64), 4)):
            x = _leaf(shape, dtype, gen)
            c = shape[1]
            w, b = _leaf((c,), dtype, gen), _leaf((c,), dtype, gen)
            y = NF.group_norm(x, groups, w, b)
            y.backward(torch.randn(shape, generator=gen).to(dtype))
            outs += [y, x.grad, w.grad, b.grad]
        x = _leaf((16, 32, 8, 8), dtype, gen)
        rm, rv = torch.zeros(32), torch.ones(32)
        y = NF.instance_norm(x, rm, rv, use_input_stats=True)
        y.backward(torch.randn(16, 32, 8, 8, generator=gen).to(dtype))
        outs += [y, x.grad, rm, rv]
    return [t.detach() for t in outs]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_serial_and_parallel_versions_give_the_same_bits(dtype):
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        serial = _run_all(dtype, parallel=False)
        parallel = _run_all(dtype, parallel=True)
    finally:
        torch.set_num_threads(threads)
    assert len(serial) == len(parallel)
    for i, (a, b) in enumerate(zip(serial, parallel)):
        assert a.dtype == b.dtype and a.shape == b.shape, i
        assert torch.equal(a.float(), b.float()), f"output {i} differs"  # bfloat16 -> float32 is exact


def test_the_size_threshold_picks_the_version():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert not _launch.use_parallel(N_AT - 1)
        assert _launch.use_parallel(N_AT) == _launch._parallel_ok
        torch.set_num_threads(1)
        assert not _launch.use_parallel(10 * N_AT)  # one thread: never a parallel region
    finally:
        torch.set_num_threads(threads)


def test_serial_twin_is_its_own_function():
    from normlab.ops.group_norm import kernels as k  # (LayerNorm's kernels are C++ now)

    twin = _jit.serial(k.gn_fwd)
    assert twin is not k.gn_fwd
    assert twin is _jit.serial(k.gn_fwd)  # made once
    assert "parallel" not in twin.targetoptions
    assert twin.py_func.__qualname__ == "gn_fwd__serial"  # cached on disk apart from the parallel one
    entry_twin = _jit.serial(k.gn_fwd_at)
    assert entry_twin.py_func.__globals__["gn_fwd"] is twin  # the entry calls the serial kernel
    assert _jit.serial(k._grad_row) is k._grad_row  # no prange inside: its own twin
