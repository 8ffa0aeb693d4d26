"""The report: its tables hold the stored numbers (computed here straight from the
store's rows), its files are all there, and sections without runs are left out."""

import base64
import csv
import json
import random
import re
import sqlite3
import statistics

import pytest

from normlab import cli
from normlab.experiments import report
from normlab.experiments.store import Store

MODES = ["eval mode", "train b=1", "train b=2", "train b=8", "train b=full"]


def _fill(path, with_all=True):
    rng = random.Random(5)
    with Store(path) as s:
        for norm in ("none", "batch", "layer"):
            for lr in (0.1, 2.0):
                for seed in range(123, 126):
                    curve = [rng.uniform(0.2, 3.0) for _ in range(30)]
                    if norm == "none" and lr == 2.0 and seed == 124:
                        curve[-1] = float("nan")
                    s.add("stability", {"norm": norm, "lr": lr, "epochs": 30}, seed, {"train_loss": curve},
                          {"eval_acc": rng.uniform(0.4, 0.95), "eval_loss": rng.uniform(0.2, 3.0),
                           "train_loss": curve[-1], "diverged": rng.random() < 0.4}, 0.01)
        if not with_all:
            return
        for norm in ("batch", "group"):
            for b in (2, 16, 128):
                for seed in (0, 1, 2):
                    s.add("batch-size", {"norm": norm, "batch_size": b, "epochs": 3}, seed,
                          {"train_loss": [1.0, 0.5, 0.2]}, {"test_acc": rng.uniform(0.5, 1.0), "train_loss": 0.2}, 0.1)
        for norm in ("batch", "layer"):
            for seed in (0, 1):
                acc = {m: rng.uniform(0.4, 1.0) for m in MODES}
                errors = {}
                if norm == "batch":
                    acc["train b=1"] = None
                    errors["train b=1"] = "ValueError: Expected more than 1 value per channel when training"
                s.add("train-eval", {"norm": norm, "epochs": 5}, seed, {}, {"accuracy": acc, "errors": errors}, 0.1)


def _md_tables(text):
    """Every Markdown table as a list of rows (lists of cells), header first."""
    tables, cur = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            if not line.startswith("|---"):
                cur.append([c.strip() for c in line.strip("|").split(" | ")])
        elif cur:
            tables.append(cur)
            cur = []
    return tables + ([cur] if cur else [])


def _stored(path, experiment):
    con = sqlite3.connect(path)
    rows = con.execute("SELECT config, seed, final FROM runs WHERE experiment = ?", (experiment,)).fetchall()
    return [(json.loads(c), s, json.loads(f)) for c, s, f in rows]


def _cell(values):
    m = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{m:.3f} ± {sd:.3f}, {min(values):.3f}..{max(values):.3f} (n={len(values)})"


def _why(curve, f):
    """The failure rule, written out again: NaN/inf, accuracy <= 0.5 + 2 sqrt(0.25/300), loss not down."""
    import math
    if not all(math.isfinite(v) for v in curve + [f["eval_loss"], f["eval_acc"]]):
        return "non-finite"
    if f["eval_acc"] <= 0.5 + 2 * math.sqrt(0.25 / 300):
        return "chance"
    return "loss" if curve[-1] >= curve[0] else None


def _stored_curves(path, experiment):
    con = sqlite3.connect(path)
    rows = con.execute("SELECT config, seed, epochs, final FROM runs WHERE experiment = ?", (experiment,)).fetchall()
    return [(json.loads(c), s, json.loads(e)["train_loss"], json.loads(f)) for c, s, e, f in rows]


def test_report_tables_hold_the_stored_numbers(tmp_path):
    store = tmp_path / "runs.sqlite"
    _fill(store)
    out = tmp_path / "rep"
    assert cli.main(["report", "--store", str(store), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    tables = _md_tables(md)
    label = {"none": "no norm", "batch": "BatchNorm", "layer": "LayerNorm", "group": "GroupNorm"}

    # stability: accuracy table, then divergence table
    stab = _stored(store, "stability")
    acc, div = tables[0], tables[1]
    assert acc[0] == ["final eval accuracy", "lr 0.1", "lr 2"]
    assert div[0] == ["failed to train", "lr 0.1", "lr 2"]
    curves = _stored_curves(store, "stability")
    for row in acc[1:] + div[1:]:
        assert row[0] in label.values()
    for norm in ("none", "batch", "layer"):
        arow = next(r for r in acc if r[0] == label[norm])
        drow = next(r for r in div if r[0] == label[norm])
        for j, lr in enumerate((0.1, 2.0), start=1):
            finals = [f for c, _, f in stab if c["norm"] == norm and c["lr"] == lr]
            assert arow[j] == _cell([f["eval_acc"] for f in finals])
            why = [_why(e, f) for c, _, e, f in curves if c["norm"] == norm and c["lr"] == lr]
            counts = ", ".join(f"{why.count(k)} {k}" for k in ("non-finite", "chance", "loss") if why.count(k))
            assert drow[j] == f"{sum(w is not None for w in why) / len(why):.2f}" + (f" ({counts})" if counts else "")

    # batch size
    bs = _stored(store, "batch-size")
    table = tables[2]
    assert table[0] == ["norm", "batch 2", "batch 16", "batch 128"]
    for norm in ("batch", "group"):
        row = next(r for r in table if r[0] == label[norm])
        for j, b in enumerate((2, 16, 128), start=1):
            assert row[j] == _cell([f["test_acc"] for c, _, f in bs if c["norm"] == norm and c["batch_size"] == b])

    # train vs eval mode; BatchNorm at b=1 shows the stored error
    te = _stored(store, "train-eval")
    table = tables[3]
    assert table[0] == ["norm"] + MODES
    for norm in ("batch", "layer"):
        row = next(r for r in table if r[0] == label[norm])
        for j, mode in enumerate(MODES, start=1):
            vals = [f["accuracy"][mode] for c, _, f in te if c["norm"] == norm]
            if None in vals:
                assert row[j].startswith("error: ValueError: Expected more than 1 value per channel")
            else:
                assert row[j] == _cell(vals)

    # the CSV has every stored run once, with its numbers
    with open(out / "runs.csv") as f:
        rows = list(csv.DictReader(f))
    n = sqlite3.connect(store).execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    assert len(rows) == n == 18 + 18 + 4
    for r in rows:
        if r["experiment"] == "stability":
            c = {"norm": r["config.norm"], "lr": float(r["config.lr"]), "epochs": 30}
            (f,) = [f for cc, s, f in stab if cc == c and s == int(r["seed"])]
            assert float(r["final.eval_acc"]) == f["eval_acc"]

    # PNGs written and embedded in the HTML; the HTML has the same cells
    html = (out / "report.html").read_text()
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == sorted(["loss_curves_lr2.png", "accuracy_vs_lr.png", "failed_vs_lr.png",
                           "accuracy_vs_batch_size.png", "train_vs_eval_mode.png"])
    embedded = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert len(embedded) == len(pngs)
    assert all(base64.b64decode(e)[:8] == b"\x89PNG\r\n\x1a\n" for e in embedded)
    assert {base64.b64decode(e) for e in embedded} == {(out / p).read_bytes() for p in pngs}
    assert acc[1][1] in html


def test_sections_without_runs_are_left_out(tmp_path):
    store = tmp_path / "runs.sqlite"
    _fill(store, with_all=False)
    r = report.run(out=str(tmp_path / "rep"), store=str(store))
    assert [s["title"].split(":")[0] for s in r["sections"]] == ["Stability"]
    assert not (tmp_path / "rep" / "accuracy_vs_batch_size.png").exists()
    assert "Batch size" not in (tmp_path / "rep" / "report.md").read_text()


def test_report_needs_an_existing_store(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["report", "--store", str(tmp_path / "none.sqlite"), "--out", str(tmp_path / "rep")])
    assert e.value.code == 2
    assert "no store at" in capsys.readouterr().err
    assert not (tmp_path / "none.sqlite").exists()
