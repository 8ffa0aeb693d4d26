"""ops/_bf16.py: half-precision <-> float32 by bits inside numba code gives torch's bits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("numba")

from numba import njit  # noqa: E402

from normlab.ops import _bf16  # noqa: E402

BITS = {torch.bfloat16: torch.int16, torch.float16: torch.uint16}


@njit
def _load_all(a, out):
    for k in range(a.shape[0]):
        out[k] = _bf16.load(a, k)


@njit
def _store_all(v, out):
    for k in range(v.shape[0]):
        _bf16.store(out, k, v[k])


@njit
def _int_f16_to_f32(a, out):  # the integer fallback, used where the CPU lacks F16C
    for k in range(a.shape[0]):
        out[k] = _bf16.f16_to_f32(a[k])


@njit
def _int_f32_to_f16(v, out):
    for k in range(v.shape[0]):
        out[k] = _bf16.f32_to_f16(v[k])


def _every_half(dtype):
    return torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)


def _hard_floats(dtype):
    """Random float32 bit patterns, every half value, its neighbours and the midpoints."""
    halves = _every_half(dtype).float().numpy()
    fin = np.sort(halves[np.isfinite(halves)]).astype(np.float64)
    rng = np.random.default_rng(0)
    with np.errstate(invalid="ignore"):
        parts = [
            rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
            halves,
            np.nextafter(halves, np.float32(np.inf)),
            np.nextafter(halves, np.float32(-np.inf)),
            ((fin[1:] + fin[:-1]) / 2).astype(np.float32),  # ties: round to even
            np.array([65504, 65519.996, 65520, 65536, 3.4e38, np.inf, -np.inf, 0.0, -0.0, 1e-45,
                      2.0**-25, 3 * 2.0**-25, 2.0**-24], np.float32),
        ]
    return np.concatenate(parts).astype(np.float32)


def _same(a, b):
    """Equal bits, or both NaN."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_to_float32_is_exact_for_every_value(dtype):
    h = _every_half(dtype)
    out = np.empty(65536, np.float32)
    _load_all(h.view(BITS[dtype]).numpy(), out)
    assert _same(out, h.float().numpy()).all()
    if dtype == torch.float16:
        _int_f16_to_f32(h.view(torch.uint16).numpy(), out)
        assert _same(out, h.float().numpy()).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_from_float32_rounds_like_torch(dtype):
    v = _hard_floats(dtype)
    want = torch.from_numpy(v).to(dtype).view(BITS[dtype]).numpy()
    nan = np.isnan(v)
    outs = [np.empty(v.size, want.dtype)]
    _store_all(v, outs[0])
    if dtype == torch.float16:
        outs.append(np.empty(v.size, np.uint16))
        _int_f32_to_f16(v, outs[1])
    for out in outs:
        assert (out[~nan] == want[~nan]).all()
        back = torch.from_numpy(out[nan]).view(dtype).float()
        assert back.isnan().all()  # NaN stays NaN


def test_float32_and_float64_pass_through():
    v = np.array([1.5, -0.0, np.inf, np.nan], np.float64)
    out = np.empty(4, np.float64)
    _load_all(v, out)
    assert _same(out.astype(np.float32), v.astype(np.float32)).all()
    out32 = np.empty(4, np.float32)
    _store_all(v, out32)
    assert _same(out32, v.astype(np.float32)).all()
