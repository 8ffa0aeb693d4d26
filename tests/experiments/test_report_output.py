"""``normlab report`` as a user meets it: a bad --out is one clear line (exit 2, no traceback,
nothing created or overwritten); report.html is the report's Markdown rendered by a real
Markdown library, runs.csv linked, readable on a phone and in print; the plots show every
series, no spread outside [0, 1], log axes labelled at the values used, legends beside
the axes; the chapter's numbers sit next to normlab's with their percentile."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from normlab.experiments import report
from normlab.experiments.store import Store

from .test_report import _fill

ENV = {**os.environ, "NORMLAB_BACKEND": "ref"}


def _normlab(cwd, *argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "normlab.cli", *argv], capture_output=True, text=True, cwd=cwd,
                          env=ENV, timeout=300)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("store") / "runs.sqlite"
    _fill(path)
    with Store(path) as s:           # the chapter's two runs, as `normlab experiment stability` stores them
        for norm, acc in (("none", 0.543), ("batch", 0.877)):
            s.add("stability-chapter", {"norm": norm, "lr": 2.0, "epochs": 30, "loop": "chapter"}, 123,
                  {"train_loss": [0.65] * 30}, {"eval_acc": acc, "eval_loss": 1.0, "train_loss": 0.65,
                                                "diverged": False}, 0.1)
        for seed, acc in zip(range(200, 204), (0.5, 0.51, 0.6, 0.7)):
            s.add("stability", {"norm": "none", "lr": 2.0, "epochs": 30, "subnormals": "flushed"}, seed,
                  {"train_loss": [0.7] * 30}, {"eval_acc": acc, "eval_loss": 3.0, "train_loss": 0.7,
                                               "diverged": False}, 0.1)
    return path


@pytest.fixture(scope="module")
def built(store, tmp_path_factory):
    out = tmp_path_factory.mktemp("rep") / "report"
    return report.run(out=str(out), store=str(store)), out


@pytest.mark.parametrize("bad,says", [
    ("README.md", "is an existing file, not a folder"),
    ("README.md/sub", "lies under README.md, which is a file, not a folder"),
    ("", "--out must name a folder"),
    ("/proc/nope", "cannot write into --out /proc/nope"),
    # a folder root may not write to either: the message names the user, not a guess
    ("/proc/sys/nope", "/proc/sys is not writable for user"),
])
def test_bad_out_is_one_line(tmp_path, store, bad, says):
    (tmp_path / "README.md").write_text("keep me\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    p = _normlab(tmp_path, "report", "--store", str(store), "--out", bad)
    assert p.returncode == 2, p.stderr
    assert says in p.stderr and "Traceback" not in p.stderr and p.stdout == ""
    assert p.stderr.count("normlab report:") == 1, p.stderr          # the command named once
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "README.md").read_text() == "keep me\n"
    assert not os.path.exists("/proc/nope")


def test_bad_out_from_python_raises_value_error(tmp_path, store):
    with pytest.raises(ValueError, match="empty path"):
        report.run(out="", store=str(store))


def test_html_is_rendered_markdown(built):
    _, out = built
    html = (out / "report.html").read_text()
    md = (out / "report.md").read_text()
    assert "`" not in re.sub(r"<[^>]+>", "", html)                 # no literal backticks: `store` is <code>
    assert "<code>" in html and '<a href="runs.csv">runs.csv</a>' in html
    assert html.count("<table>") == md.count("\n|---") and "<th>" in html
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in html
    assert "@media print" in html and "@media (max-width" in html
    assert "<li>" in html                                          # the chapter notes are a list


def test_chapter_numbers_beside_normlabs_with_percentile(built):
    r, out = built
    md = (out / "report.md").read_text()
    assert "match" not in md.lower().split("## stability")[0]
    chapter = r["sections"][0]
    header, rows = chapter["tables"][0]
    assert "chapter's eval accuracy" in header
    none = next(row for row in rows if row[0] == "no norm")
    assert none[header.index("eval accuracy")] == "0.543" and none[header.index("chapter's eval accuracy")] == "0.520"
    # 0.520 among the study's no-norm runs at lr 2 (config with subnormals flushed): 0.5, 0.51, 0.6, 0.7
    assert "no norm: the chapter's 0.520 lies at percentile 50 of normlab's 4 runs at lr 2 (2 below it" in md


def test_plots_show_every_series_within_bounds(built):
    r, out = built
    plots = r["plots"]
    assert set(plots) == {"loss_curves_lr2.png", "accuracy_vs_lr.png", "failed_vs_lr.png",
                          "accuracy_vs_batch_size.png", "train_vs_eval_mode.png"}
    for name, facts in plots.items():
        ax_x, ax_y, ax_w, ax_h = facts["axes_box"]
        lx, ly, lw, lh = facts["legend_box"]
        if name != "train_vs_eval_mode.png":
            assert lx >= ax_x + ax_w, name                             # the legend is beside the axes
        series = facts.get("series", {})
        styles = [(s["marker"], s["linestyle"]) for s in series.values()]
        assert len(set(styles)) == len(styles), name                  # each series its own look
        for s in series.values():
            if s.get("low") is not None:
                assert 0.0 <= s["low"] <= s["high"] <= 1.0, name      # spreads are runs, inside [0, 1]
            if "x" in s and len(series) > 1:
                assert len(set(s["x"]) & {x for t in series.values() if t is not s for x in t["x"]}) == 0
    assert plots["accuracy_vs_lr.png"]["xticks"] == ["0.1", "2"]
    assert plots["failed_vs_lr.png"]["xticks"] == ["0.1", "2"]
    assert plots["accuracy_vs_batch_size.png"]["xticks"] == ["2", "16", "128"]
    # each learning rate is one step of the axis; its series stay within 0.2 of a step of its tick
    # (on a log axis the old nudge made lr 2 read as 1.7..2.3), and chance is marked
    for name in ("accuracy_vs_lr.png", "failed_vs_lr.png", "accuracy_vs_batch_size.png"):
        ticks = sorted(plots[name]["ticks"].values())
        for s in plots[name]["series"].values():
            assert all(min(abs(x - t) for t in ticks) <= 0.2 + 1e-9 for x in s["x"]), (name, s["x"])
    assert plots["accuracy_vs_lr.png"]["chance"] == 0.5


def _snapshot(folder):
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("kind", ["wal", "rollback"])
def test_a_report_leaves_its_store_untouched(kind, store, tmp_path):
    """A report only reads: the store's bytes and mtime are unchanged and no file is left beside it,
    for a store as `normlab experiment` writes it (WAL) and as committed in docs/runs (rollback journal)."""
    src = store if kind == "wal" else Path(__file__).resolve().parents[2] / "docs" / "runs" / "stability.sqlite"
    folder = tmp_path / "store"
    folder.mkdir()
    copy = folder / "runs.sqlite"
    shutil.copy2(src, copy)
    with open(copy, "rb") as f:
        assert f.read(20)[18] == (2 if kind == "wal" else 1)   # the header's journal mode
    before = _snapshot(folder)
    p = _normlab(tmp_path, "report", "--store", str(copy), "--out", str(tmp_path / "report"))
    assert p.returncode == 0, p.stderr
    assert _snapshot(folder) == before
    with pytest.raises(sqlite3.OperationalError, match="readonly"):      # the Python entry: opened to read only
        with Store(copy, read_only=True) as s:
            s.add("stability", {"norm": "none"}, 1, {}, {}, 0.0)
    assert _snapshot(folder) == before
