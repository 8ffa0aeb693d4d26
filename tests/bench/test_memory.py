"""normlab bench --suite memory: the method sees a held and a freed allocation, the cases, the
verdict, the rows, files and resume. Every measurement runs in a fresh child process."""

from __future__ import annotations

import pytest

from normlab.bench.memory import (FIELDS, PROVIDERS, calibrate, measure_in_subprocess, memory_cases, run_memory,
                                  verdict)
from normlab.bench.sweep import SweepCase
from tests.bench.files import csv_rows, json_rows


def test_method_sees_100mb_held_and_none_once_freed():
    cal = calibrate(100)
    held, freed = cal["held"], cal["freed"]
    assert held["status"] == freed["status"] == "ok", cal
    for r in (held, freed):  # the call's 100 MB shows in the peak either way
        assert 98 <= r["peak_mb"] <= 110, r
    assert 98 <= held["held_mb"] <= 110 and 99 <= held["malloc_held_mb"] <= 101, held
    assert abs(freed["held_mb"]) < 8 and abs(freed["malloc_held_mb"]) < 1, freed


def test_a_module_call_in_a_child():
    case = SweepCase("LayerNorm", (256,), (512, 256), family="layer_norm")  # 512 KB of float32
    spec = {"kind": "module", "provider": "torch", "case": case.spec(), "dtype": "float32", "mode": "fwd+bwd",
            "threads": 1}
    r = measure_in_subprocess(spec)
    assert r["status"] == "ok", r
    assert 0.9 <= r["peak_mb"] < 16, r  # y and x.grad: 1 MB, under the page-level noise of the rest
    bad = measure_in_subprocess(dict(spec, dtype="float64"))
    assert bad["status"] == "error" and "float64" in bad["reason"]


def test_cases_quick_full_large_and_filters():
    quick, full, large = memory_cases(quick=True), memory_cases(), memory_cases(large=True)
    assert len(quick) == 12 and len({(c.case, c.dtype, c.mode) for c in full}) == len(full)
    assert {c.case.family for c in quick} == {c.case.family for c in full} == {
        "layer_norm", "rms_norm", "batch_norm", "group_norm", "instance_norm", "layer_norm2d"}
    assert {(c.case.layout, c.dtype, c.mode) for c in full if c.case.name == "BatchNorm2d"} >= {
        ("channels_last", "bfloat16", "eval fwd+bwd"), ("contiguous", "float32", "fwd")}
    big = {(c.case.name, c.case.shape) for c in large if c.large}
    assert ("BatchNorm2d", (1, 8, 4096, 4096)) in big and ("BatchNorm3d", (1, 4, 64, 512, 512)) in big
    assert not any(c.large for c in full)
    only = memory_cases(families=["group_norm"], dtypes=["bfloat16"], modes=["fwd"])
    assert only and {(c.case.family, c.dtype, c.mode) for c in only} == {("group_norm", "bfloat16", "fwd")}


def test_verdict_against_the_targets():
    def row(np, tp, nh, th, nm=0.0, tm=0.0):
        return {"status": "ok", "normlab_peak_mb": np, "torch_peak_mb": tp, "normlab_held_mb": nh,
                "torch_held_mb": th, "normlab_malloc_held_mb": nm, "torch_malloc_held_mb": tm}
    assert verdict(row(528, 513, 30, 0)) == "ok"
    assert verdict(row(2560, 513, 2082, 37, 2080, 0)) == "over: peak +2047 MB, held +2045 MB, malloc held +2080 MB"
    assert verdict(row(10, 10, 0, 0, 40, 0)) == "over: malloc held +40 MB"
    assert verdict({"status": "error"}) == ""


def test_run_rows_files_and_resume(tmp_path):
    out = str(tmp_path / "m")
    kw = dict(quick=True, ops="layer_norm", modes="fwd+bwd", threads="1", out=out, progress=False)
    result = run_memory(calibrate_mb=None, **kw)
    assert result["measured"] == 1 and result["calibration"] is None
    (r,) = result["rows"]
    assert (r["layer"], r["shape"], r["status"]) == ("LayerNorm(4096)", "2048x4096", "ok"), r
    for p in PROVIDERS:  # y and x.grad of a 32 MB input at least
        assert r[f"{p}_peak_mb"] >= 63, r
    assert r["verdict"].startswith(("ok", "over"))
    assert tuple(csv_rows(result["files"]["csv"])[0]) == FIELDS and len(json_rows(result["files"]["json"])) == 1
    again = run_memory(calibrate_mb=None, resume=True, **kw)
    assert again["measured"] == 0 and again["skipped"] == 1 and len(again["rows"]) == 1
    with pytest.raises(ValueError, match="unknown dtype 'float16'"):
        run_memory(dtypes="float16", out=out)
