"""numerics/vmath.h's float32 erf (GELU's) and forward tanh (DyT's) on their own, against the C
library's float64 erf and tanh, in ulp, at each x86-64 level this CPU runs; and the same bits at
v3 and v4 (fused multiply-add at both; only the vector width differs).

A thinned version of ``scripts/erf-ulp.py`` (which scans every float32): every 61st float32 (an
odd stride, so that every vector lane and fraction pattern comes up) over the whole range, and
every float32 around the places where an interval starts. Needs g++ (the scanner is the header
compiled on its own).
"""

from __future__ import annotations

import importlib.util
import pathlib
import shutil
import tempfile

import pytest

_spec = importlib.util.spec_from_file_location("erf_ulp", pathlib.Path(__file__).parents[3] / "scripts" / "erf-ulp.py")
erf_ulp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(erf_ulp)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def _cpu_runs() -> list[str]:
    flags = pathlib.Path("/proc/cpuinfo").read_text() if pathlib.Path("/proc/cpuinfo").exists() else ""
    runs = ["v1"]
    if all(f in flags for f in (" avx2", " fma", " bmi2", " f16c")):
        runs.append("v3")
        if all(f in flags for f in (" avx512f", " avx512bw", " avx512vl", " avx512dq")):
            runs.append("v4")
    return runs


LEVELS = _cpu_runs()
# (fn, whole range, where the intervals start, bound at v3/v4, bound at v1): measured over every
# float32 (scripts/erf-ulp.py): erf 0.68 (v3, v4), 0.73 (v1); tanh 0.74 (v3, v4), 1.33 (v1: exp)
CASES = {
    "erf": ((2.0 ** -30, 5.0), [0.625, 0.75, 1.0, 1.25, 2.0, 2.5, 3.5, 3.92, 4.0], 0.8, 1.0),
    "tanh": ((2.0 ** -30, 12.0), [0.5, 0.625, 0.75, 1.0, 2.0, 4.0, 4.27, 5.0, 7.0, 9.01, 10.0], 1.0, 1.5),
}


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory() as d:
        yield d


def _windows(points):
    return [(p * (1 - 2.0 ** -12), p * (1 + 2.0 ** -12)) for p in points]


@pytest.mark.parametrize("fn", sorted(CASES))
@pytest.mark.parametrize("level", LEVELS)
def test_within_bound_at_each_level(fn, level, workdir):
    (lo, hi), points, bound_fma, bound_v1 = CASES[fn]
    bound = bound_v1 if level == "v1" else bound_fma
    for a, b, step in [(lo, hi, 61)] + [(a, b, 1) for a, b in _windows(points)]:
        worst, where, _ = erf_ulp.scan(fn, a, b, step, level, workdir)
        assert worst <= bound, (fn, level, worst, where)


@pytest.mark.parametrize("fn", sorted(CASES))
@pytest.mark.parametrize("level", LEVELS)
def test_infinity_gives_one(fn, level, workdir):
    worst, _, _ = erf_ulp.scan(fn, float("inf"), float("inf"), 1, level, workdir)  # +-inf
    assert worst == 0.0


@pytest.mark.skipif("v4" not in LEVELS, reason="needs a CPU that runs v3 and v4")
@pytest.mark.parametrize("fn", sorted(CASES))
def test_the_same_bits_at_v3_and_v4(fn, workdir):
    (lo, hi), points, _, _ = CASES[fn]
    for a, b, step in [(lo, hi, 61)] + [(a, b, 1) for a, b in _windows(points)]:
        bits = {level: erf_ulp.scan(fn, a, b, step, level, workdir)[2] for level in ("v3", "v4")}
        assert bits["v3"] == bits["v4"], (fn, a, b)
