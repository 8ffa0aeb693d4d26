"""``normlab report [--store PATH] --out DIR``: the stored runs as a self-contained report.

Writes ``report.md`` (tables, links to the PNGs), ``report.html`` (the same, with the
images embedded as base64: one file to mail or open anywhere), one PNG per plot
(matplotlib, Agg backend) and ``runs.csv`` (every stored run, one row each). Every
number comes from the store; a section whose experiment has no runs is left out.

Sections: the chapter's runs; the stability study (accuracy and divergence by norm and
learning rate, the loss curves at lr 2.0 with the spread over seeds, accuracy and
divergence against learning rate); accuracy against batch size; train-mode against
eval-mode accuracy.
"""

from __future__ import annotations

import argparse
import base64
import csv
import html
import json
import os
import statistics
from pathlib import Path

from . import _common as C
from .store import DEFAULT_STORE, Store, check_path

LABEL = {"none": "no norm", "batch": "BatchNorm", "layer": "LayerNorm", "rms": "RMSNorm", "group": "GroupNorm"}
CURVE_LR = 2.0


def _label(norm: str) -> str:
    return LABEL.get(norm, norm)


def _group(runs: list[dict], *keys: str) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = {}
    for r in runs:
        out.setdefault(tuple(r["config"][k] for k in keys), []).append(r)
    return out


def _order(values) -> list:
    norms = list(LABEL)
    return sorted(set(values), key=lambda v: (norms.index(v) if v in norms else len(norms), str(v)))


def _fmt(v, nd: int = 3) -> str:
    return "n/a" if v is None else f"{v:.{nd}f}"


# --------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------

def _figure():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    return plt, fig, ax


def _save(plt, fig, ax, out: Path, name: str) -> str:
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / name)
    plt.close(fig)
    return name


def _plot_lines(out: Path, name: str, series: dict, xlabel: str, ylabel: str, title: str, logx: int = 0,
                err: bool = True) -> str:
    """``series``: {label: [(x, y, yerr)]}; ``logx``: the base of a log x axis (0: linear)."""
    plt, fig, ax = _figure()
    for label, pts in series.items():
        xs, ys, es = zip(*pts)
        ys = [float("nan") if v is None else v for v in ys]
        if err:
            ax.errorbar(xs, ys, yerr=[0 if e is None else e for e in es], marker="o", capsize=3, label=label)
        else:
            ax.plot(xs, ys, marker="o", label=label)
    if logx:
        ax.set_xscale("log", base=logx)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    return _save(plt, fig, ax, out, name)


def _plot_curves(out: Path, runs_by_norm: dict[str, list[dict]]) -> str:
    """Median training loss per epoch at lr 2.0, with the band from the lowest to the
    highest seed; a NaN/inf loss is drawn as missing."""
    import math
    plt, fig, ax = _figure()
    for norm, runs in runs_by_norm.items():
        curves = [r["epochs"]["train_loss"] for r in runs]
        epochs = range(1, len(curves[0]) + 1)
        cols = [[c[e] for c in curves if c[e] is not None and math.isfinite(c[e])] for e in range(len(curves[0]))]
        med = [statistics.median(c) if c else float("nan") for c in cols]
        lo = [min(c) if c else float("nan") for c in cols]
        hi = [max(c) if c else float("nan") for c in cols]
        line, = ax.plot(epochs, med, label=f"{_label(norm)} (median of {len(runs)})")
        ax.fill_between(epochs, lo, hi, color=line.get_color(), alpha=0.15)
    ax.set_yscale("log")
    ax.set(xlabel="epoch", ylabel="training loss", title=f"loss curves at lr {CURVE_LR:g}: median, band = min..max over seeds")
    return _save(plt, fig, ax, out, "loss_curves_lr2.png")


# --------------------------------------------------------------------------
# Sections: each returns {"title", "text", "tables": [(header, rows)], "images": [png]}
# --------------------------------------------------------------------------

def _chapter_section(runs: list[dict]) -> dict:
    rows = []
    for r in sorted(runs, key=lambda r: _order(list(LABEL) + [r["config"]["norm"]]).index(r["config"]["norm"])):
        f = r["final"]
        rows.append([_label(r["config"]["norm"]), f"{r['config']['lr']:g}", str(r["seed"]),
                     _fmt(f["train_loss"], 4), _fmt(f["eval_loss"], 4), _fmt(f["eval_acc"])])
    return {"title": "The chapter's runs (seed 123, lr 2.0, the chapter's loop)",
            "text": "The BatchNorm chapter prints eval accuracy 0.520 without a norm and 0.877 with BatchNorm1d.",
            "tables": [(["model", "lr", "seed", "final train loss", "eval loss", "eval accuracy"], rows)], "images": []}


def _stability_section(runs: list[dict], out: Path) -> dict:
    cells = _group(runs, "norm", "lr")
    norms, lrs = _order(k[0] for k in cells), sorted({k[1] for k in cells})
    acc_rows, div_rows, acc_series, div_series = [], [], {}, {}
    for norm in norms:
        acc_row, div_row = [_label(norm)], [_label(norm)]
        for lr in lrs:
            rs = cells.get((norm, lr), [])
            if not rs:
                acc_row.append("")
                div_row.append("")
                continue
            m, s = C.mean_std([r["final"]["eval_acc"] for r in rs])
            d = sum(bool(r["final"]["diverged"]) for r in rs) / len(rs)
            acc_row.append(f"{C.pm(m, s)} (n={len(rs)})")
            div_row.append(f"{d:.2f}")
            acc_series.setdefault(_label(norm), []).append((lr, m, s))
            div_series.setdefault(_label(norm), []).append((lr, d, None))
        acc_rows.append(acc_row)
        div_rows.append(div_row)
    header = [f"lr {lr:g}" for lr in lrs]
    images = [_plot_lines(out, "accuracy_vs_lr.png", acc_series, "learning rate", "final eval accuracy",
                          "accuracy vs learning rate (mean ± std over seeds)", logx=10),
              _plot_lines(out, "divergence_vs_lr.png", div_series, "learning rate", "fraction diverged",
                          "divergence vs learning rate", logx=10, err=False)]
    at_lr = {norm: cells[(norm, CURVE_LR)] for norm in norms if (norm, CURVE_LR) in cells}
    if at_lr:
        images.insert(0, _plot_curves(out, at_lr))
    return {"title": "Stability: the chapter's MLP on make_moons, full-batch SGD, 30 epochs",
            "text": ("Final eval accuracy, mean ± std over weight seeds (n runs), then the fraction of runs that "
                     "diverged (a NaN/inf loss, or the last training loss above 10x the first)."),
            "tables": [(["final eval accuracy"] + header, acc_rows), (["fraction diverged"] + header, div_rows)],
            "images": images}


def _batch_size_section(runs: list[dict], out: Path) -> dict:
    cells = _group(runs, "norm", "batch_size")
    norms, sizes = _order(k[0] for k in cells), sorted({k[1] for k in cells})
    rows, series = [], {}
    for norm in norms:
        row = [_label(norm)]
        for b in sizes:
            rs = cells.get((norm, b), [])
            if not rs:
                row.append("")
                continue
            m, s = C.mean_std([r["final"]["test_acc"] for r in rs])
            row.append(f"{C.pm(m, s)} (n={len(rs)})")
            series.setdefault(_label(norm), []).append((b, m, s))
        rows.append(row)
    img = _plot_lines(out, "accuracy_vs_batch_size.png", series, "batch size", "test accuracy (eval mode)",
                      "accuracy vs batch size (mean ± std over seeds)", logx=2)
    return {"title": "Batch size: a small CNN on scikit-learn's digits",
            "text": "Test accuracy in eval mode on the held-out split, mean ± std over seeds (n runs).",
            "tables": [(["norm"] + [f"batch {b}" for b in sizes], rows)], "images": [img]}


def _train_eval_section(runs: list[dict], out: Path) -> dict:
    by_norm = _group(runs, "norm")
    norms = _order(k[0] for k in by_norm)
    modes = [k for k in by_norm[(norms[0],)][0]["final"]["accuracy"]]
    rows, series, failed = [], {}, []
    for norm in norms:
        rs = by_norm[(norm,)]
        row = [_label(norm)]
        for mode in modes:
            vals = [r["final"]["accuracy"][mode] for r in rs]
            if any(v is None for v in vals):
                row.append("error: " + rs[0]["final"]["errors"].get(mode, "?"))
                failed.append((norms.index(norm), modes.index(mode)))
                continue
            m, s = C.mean_std(vals)
            row.append(f"{C.pm(m, s)} (n={len(rs)})")
            series.setdefault(_label(norm), []).append((mode, m, s))
        rows.append(row)
    plt, fig, ax = _figure()
    width = 0.8 / max(1, len(series))
    for i, (label, pts) in enumerate(series.items()):
        xs = [modes.index(p[0]) + i * width for p in pts]
        ax.bar(xs, [p[1] for p in pts], width, yerr=[p[2] for p in pts], capsize=3, label=label)
    for i, j in failed:                       # the layer raised: no bar, say so
        ax.text(j + i * width, 0.02, "raises", rotation=90, ha="center", va="bottom", fontsize=8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(modes))], modes, fontsize=8)
    ax.set(ylabel="test accuracy", title="evaluated in eval mode vs in train mode at batch size b")
    img = _save(plt, fig, ax, out, "train_vs_eval_mode.png")
    return {"title": "Train mode vs eval mode at evaluation",
            "text": ("Accuracy of the same trained model evaluated in eval mode and in train mode on batches of "
                     "b test samples; mean ± std over seeds. An error is what the layer raises."),
            "tables": [(["norm"] + modes, rows)], "images": [img]}


# --------------------------------------------------------------------------
# Writers
# --------------------------------------------------------------------------

def _md_table(header, rows) -> str:
    esc = lambda c: str(c).replace("|", "\\|")
    lines = ["| " + " | ".join(map(esc, header)) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(esc, r)) + " |" for r in rows])


def _html_table(header, rows) -> str:
    th = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    trs = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"


def _write_csv(path: Path, runs: list[dict]) -> None:
    final_keys = sorted({k for r in runs for k in r["final"]})
    config_keys = sorted({k for r in runs for k in r["config"]})
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "experiment", "seed"] + [f"config.{k}" for k in config_keys]
                   + [f"final.{k}" for k in final_keys] + ["wall_s", "normlab", "torch", "created", "epochs"])
        for r in runs:
            cell = lambda v: json.dumps(v) if isinstance(v, (dict, list)) else ("" if v is None else v)
            w.writerow([r["id"], r["experiment"], r["seed"]] + [cell(r["config"].get(k)) for k in config_keys]
                       + [cell(r["final"].get(k)) for k in final_keys]
                       + [r["wall_s"], r["normlab"], r["torch"], r["created"], json.dumps(r["epochs"])])


def build(store: str, out: str) -> dict:
    """Write the report into ``out``; returns its sections (tables as data) and paths."""
    outp = Path(out)
    with Store(store, must_exist=True) as st:
        runs = st.runs()
    outp.mkdir(parents=True, exist_ok=True)
    by_exp: dict[str, list[dict]] = {}
    for r in runs:
        by_exp.setdefault(r["experiment"], []).append(r)
    sections = []
    if by_exp.get("stability-chapter"):
        sections.append(_chapter_section(by_exp["stability-chapter"]))
    if by_exp.get("stability"):
        sections.append(_stability_section(by_exp["stability"], outp))
    if by_exp.get("batch-size"):
        sections.append(_batch_size_section(by_exp["batch-size"], outp))
    if by_exp.get("train-eval"):
        sections.append(_train_eval_section(by_exp["train-eval"], outp))
    _write_csv(outp / "runs.csv", runs)
    head = (f"Every number below is read from the store `{store}` ({len(runs)} runs; "
            f"normlab {', '.join(sorted({r['normlab'] for r in runs}))}, torch {', '.join(sorted({r['torch'] for r in runs}))}). "
            "All runs: runs.csv.")
    md = ["# normlab experiments report", "", head, ""]
    body = [f"<h1>normlab experiments report</h1><p>{html.escape(head)}</p>"]
    for s in sections:
        md += [f"## {s['title']}", "", s["text"], ""]
        body.append(f"<h2>{html.escape(s['title'])}</h2><p>{html.escape(s['text'])}</p>")
        for header, rows in s["tables"]:
            md += [_md_table(header, rows), ""]
            body.append(_html_table(header, rows))
        for img in s["images"]:
            md += [f"![{img}]({img})", ""]
            data = base64.b64encode((outp / img).read_bytes()).decode()
            body.append(f'<p><img alt="{img}" src="data:image/png;base64,{data}"></p>')
    (outp / "report.md").write_text("\n".join(md))
    style = ("body{font-family:sans-serif;max-width:60em;margin:2em auto}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:.25em .5em;font-size:90%}img{max-width:100%}")
    (outp / "report.html").write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>normlab report</title>"
                                      f"<style>{style}</style></head><body>{''.join(body)}</body></html>")
    files = ["report.md", "report.html", "runs.csv"] + [i for s in sections for i in s["images"]]
    return {"store": str(store), "out": str(outp), "runs": len(runs), "files": [os.path.join(str(outp), f) for f in files],
            "sections": [{"title": s["title"], "tables": s["tables"]} for s in sections]}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", type=C.arg(lambda s: str(check_path(s, must_exist=True))), default=DEFAULT_STORE,
                   help=f"the store to report on (default {DEFAULT_STORE})")
    p.add_argument("--out", required=True, help="folder for report.md, report.html, the PNGs and runs.csv")


def run(out: str, store: str = DEFAULT_STORE) -> dict:
    return build(store, out)


def render(r: dict) -> str:
    lines = [f"report on {r['runs']} runs from {r['store']}:"]
    lines += [f"  {s['title']}" for s in r["sections"]] or ["  (no runs)"]
    lines += ["files:"] + [f"  {f}" for f in r["files"]]
    lines.append(f"open {os.path.join(r['out'], 'report.html')} (images embedded) or read {os.path.join(r['out'], 'report.md')}")
    return "\n".join(lines)
