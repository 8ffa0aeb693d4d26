"""normlab bench --suite sweep: the seeded draw, the rows and files, resume, the worst cells, the
geometric means and the rerun. Tiny cells (--max-mb 0.05) and one repeat; no timed assertions."""

from __future__ import annotations

import argparse
import math

import pytest

from normlab.bench import add_bench_parser, main_bench, run
from normlab.bench.sweep import DTYPES, FAMILY_MODES, MODES, candidates, draw_cells, run_sweep
from normlab.bench.sweep_report import FIELDS, geomeans, render, worst
from tests.bench.files import csv_rows, json_rows

FAST = {"repeats": 1, "warmup": 0, "min_sample_ms": 0.05, "max_group_s": 0.5, "max_mb": 0.05, "progress": False}


def test_same_seed_same_cells_and_prefix():
    a, b = draw_cells(40, seed=7), draw_cells(40, seed=7)
    assert [c.key() for c in a] == [c.key() for c in b]
    assert [c.key() for c in draw_cells(10, seed=7)] == [c.key() for c in a[:10]]
    assert [c.key() for c in draw_cells(40, seed=8)] != [c.key() for c in a]
    assert len({c.key() for c in a}) == 40 and [c.index for c in a] == list(range(40))


def test_draw_respects_the_space_and_the_filters():
    cells = draw_cells(300, seed=0)
    assert all(c.mbytes <= 64 for c in cells)
    assert {c.case.family for c in cells} == set(FAMILY_MODES)
    assert {c.dtype for c in cells} == set(DTYPES) and {c.threads for c in cells} == {1, 2}
    assert {c.mode for c in cells} == set(MODES)
    assert {len(c.case.shape) for c in cells} == {2, 4, 5}  # rows, images and 3-D volumes
    for c in cells:
        assert c.mode in FAMILY_MODES[c.case.family]  # eval fwd+bwd: BatchNorm's only
        if c.case.family in ("layer_norm", "rms_norm"):
            rows, hidden = c.case.shape
            assert 1 <= rows <= 8192 and 16 <= hidden <= 16384 and c.case.layout == "contiguous"
        else:
            assert 1 <= c.case.shape[0] <= 64 and 1 <= c.case.shape[1] <= 512
    assert {c.case.layout for c in cells if len(c.case.shape) > 2} == {"contiguous", "channels_last"}
    some = draw_cells(30, seed=1, families=["group_norm"], modes=["fwd+bwd"], dtypes=["bfloat16"], threads=[2],
                      max_mb=1.0)
    assert {(c.case.name, c.mode, c.dtype, c.threads) for c in some} == {("GroupNorm", "fwd+bwd", "bfloat16", 2)}
    assert all(c.mbytes <= 1.0 and c.case.shape[1] % c.case.args[0] == 0 for c in some)


def test_candidates_run_every_mode_on_both_providers():
    for mode in MODES:
        cell = draw_cells(1, seed=3, families=["batch_norm"], modes=[mode], max_mb=0.05)[0]
        cands = candidates(cell.case, "float32", mode)
        assert set(cands) == {"torch", "normlab"}
        for cand in cands.values():
            with cand.context():
                cand.prepare()()


def test_rows_files_resume_and_rerun(tmp_path):
    out = str(tmp_path / "s")
    first = run_sweep(cells=3, seed=5, out=out, threads="1", **FAST)
    assert first["measured"] == 3 and first["skipped"] == 0 and not first["interrupted"]
    drawn = draw_cells(3, seed=5, threads=[1], max_mb=0.05)
    assert [r["cell"] for r in first["rows"]] == [0, 1, 2]
    assert {(r["layer"], r["shape"], r["mode"]) for r in first["rows"]} == \
        {(c.case.label, c.case.shape_str, c.mode) for c in drawn}
    for r in first["rows"]:
        assert r["status"] == "ok", r
        assert r["x_torch"] == pytest.approx(r["torch_us"] / r["normlab_us"], rel=1e-9)
    rows = csv_rows(first["files"]["csv"])
    assert tuple(rows[0]) == FIELDS and len(rows) == 3
    assert len(json_rows(first["files"]["json"])) == 3 and first["files"]["png"] == [str(tmp_path / "s" / "sweep.png")]

    again = run_sweep(cells=4, seed=5, out=out, threads="1", resume=True, **FAST)
    assert again["measured"] == 1 and again["skipped"] == 3
    assert sorted(r["cell"] for r in again["rows"]) == [0, 1, 2, 3]

    slow = worst(again["rows"], 2)
    rerun = run_sweep(out=out, rerun_worst=2, **FAST)
    assert rerun["measured"] == 2 and len(rerun["rows"]) == 4
    redone = {r["cell"]: r for r in rerun["rows"] if r["reruns"] == 1}
    assert set(redone) == {r["cell"] for r in slow}
    for r in slow:
        assert redone[r["cell"]]["x_torch_first"] == r["x_torch"]


def test_worst_is_ordered_and_geomeans_pool():
    def row(cell, family, layout, threads, x):
        return {"cell": cell, "family": family, "layout": layout, "threads": threads, "x_torch": x, "status": "ok"}
    rows = [row(0, "batch_norm", "channels_last", 1, 0.5), row(1, "batch_norm", "contiguous", 2, 2.0),
            row(2, "layer_norm", "contiguous", 1, 4.0), row(3, "layer_norm", "contiguous", 2, 0.5),
            {"cell": 4, "status": "error", "x_torch": None}]
    assert [r["cell"] for r in worst(rows, 3)] == [0, 3, 1]  # ties in draw order
    g = geomeans(rows)
    assert g[("all", "all", "all")] == (pytest.approx(math.prod([0.5, 2.0, 4.0, 0.5]) ** 0.25), 4)
    assert g[("batch_norm", "all", "all")] == (pytest.approx(1.0), 2)
    assert g[("all", "contiguous", "2")] == (pytest.approx(1.0), 2)
    assert ("layer_norm", "channels_last", "all") not in g


def test_report_and_cli(tmp_path, capsys):
    out = str(tmp_path / "c")
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers())
    args = parser.parse_args(["bench", "--suite", "sweep", "--cells", "2", "--out", out, "--repeats", "1",
                              "--warmup", "0", "--threads", "1", "--worst", "1", "--ops", "row"])
    result = run(**{k: getattr(args, k) for k in ("suite", "out", "cells", "repeats", "warmup", "threads", "worst",
                                                  "ops")}, quick=True, max_mb=0.05)
    text = render(result)
    assert "the 1 worst cells" in text and "geometric mean" in text and result["summary"] in text
    capsys.readouterr()  # the run's progress lines
    for bad, expected in ((["--cells", "0"], "--cells: expected a whole number >= 1"),
                          (["--modes", "eval fwd+bwd", "--ops", "layer_norm"], "no family runs the modes"),
                          (["--rerun-worst", "2", "--out", str(tmp_path / "none")], "--rerun-worst needs measured"),
                          (["--sizes", "4x6"], "--sizes is not used by this suite")):
        assert main_bench(parser.parse_args(["bench", "--suite", "sweep", *bad])) == 2
        err = capsys.readouterr().err
        assert expected in err and err.count("\n") == 1
    assert main_bench(parser.parse_args(["bench", "--cells", "3"])) == 2
    assert "--cells belongs to --suite sweep" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()
