"""``normlab report [--store PATH] --out DIR``: the stored runs as a self-contained report.

Writes ``report.md`` (tables, links to the PNGs and to runs.csv), ``report.html`` (that
Markdown rendered by Python-Markdown, the docs site's library, with the images embedded
as base64: one file to mail or open anywhere, readable on a phone and in print), one PNG
per plot (matplotlib, Agg backend) and ``runs.csv`` (every stored run, one row each).
Every number comes from the store; a section whose experiment has no runs is left out.
A bad ``--out`` (empty, a file, under a file, not writable) is refused before any work.

Sections: the chapter's runs beside the chapter's numbers, with the percentile of its
accuracy among normlab's runs at lr 2.0; the stability study (accuracy and the fraction
that failed to train by norm and learning rate, the loss curves at lr 2.0 with the spread
over seeds, both against learning rate); accuracy against batch size; train-mode against
eval-mode accuracy. Plots show every series (own marker and line style, side by side around
each learning rate or batch size) and every run, never a mean ± std bar outside [0, 1]; the
accuracy plot marks chance.
"""

from __future__ import annotations

import argparse
import base64
import csv
import json
import os
import re
import statistics
import tempfile
from pathlib import Path

from . import arguments, summaries
from ._plots import STYLES, _figure, _plot_lines, _save, coinciding
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
# Plots (the drawing helpers are in _plots)
# --------------------------------------------------------------------------

def _plot_curves(out: Path, runs_by_norm: dict[str, list[dict]], info: dict | None = None) -> str:
    """Median training loss per epoch at lr 2.0, with the band from the lowest to the
    highest seed; a NaN/inf loss is drawn as missing."""
    import math
    plt, fig, ax = _figure()
    facts = {"series": {}}
    for i, (norm, runs) in enumerate(runs_by_norm.items()):
        marker, style = STYLES[i % len(STYLES)]
        curves = [r["epochs"]["train_loss"] for r in runs]
        epochs = range(1, len(curves[0]) + 1)
        cols = [[c[e] for c in curves if c[e] is not None and math.isfinite(c[e])] for e in range(len(curves[0]))]
        med = [statistics.median(c) if c else float("nan") for c in cols]
        lo = [min(c) if c else float("nan") for c in cols]
        hi = [max(c) if c else float("nan") for c in cols]
        line, = ax.plot(epochs, med, label=f"{_label(norm)} (median of {len(runs)})", linestyle=style,
                        marker=marker, markevery=(i % 5, 5), markersize=5)
        ax.fill_between(epochs, lo, hi, color=line.get_color(), alpha=0.12)
        facts["series"][_label(norm)] = {"marker": marker, "linestyle": str(style)}
    ax.set_yscale("log")
    ax.set(xlabel="epoch", ylabel="training loss", title=f"loss curves at lr {CURVE_LR:g}: median, band = min..max over seeds")
    name = _save(plt, fig, ax, out, "loss_curves_lr2.png", facts)
    if info is not None:
        info[name] = facts
    return name


# --------------------------------------------------------------------------
# Sections: each returns {"title", "text", "tables": [(header, rows)], "images": [png]}
# --------------------------------------------------------------------------

def _chapter_section(runs: list[dict], study: list[dict]) -> dict:
    from .stability import CHAPTER_LR, CHAPTER_PRINTED, config, percentile_among
    rows, notes = [], []
    for r in sorted(runs, key=lambda r: _order(list(LABEL) + [r["config"]["norm"]]).index(r["config"]["norm"])):
        norm, f = r["config"]["norm"], r["final"]
        printed = CHAPTER_PRINTED.get(norm, {})
        rows.append([_label(norm), f"{r['config']['lr']:g}", str(r["seed"]), _fmt(f["train_loss"], 4),
                     _fmt(f["eval_loss"], 4), _fmt(printed.get("eval_loss"), 4), _fmt(f["eval_acc"]),
                     _fmt(printed.get("eval_acc"))])
        same = [x for x in study if x["config"] == config(norm, CHAPTER_LR)]
        sp = percentile_among(printed["eval_acc"], [x["final"]["eval_acc"] for x in same]) if printed else None
        if sp:
            notes.append(f"{_label(norm)}: the chapter's {sp['value']:.3f} lies at percentile {sp['percentile']:.0f} "
                         f"of normlab's {sp['n']} runs at lr {CHAPTER_LR:g} ({sp['below']} below it, "
                         f"{sp['equal']} equal; min {sp['min']:.3f}, median {sp['median']:.3f}, max {sp['max']:.3f}).")
    text = ("The chapter's two runs (seed 123, lr 2.0, its own training loop) with normlab's layers, beside the "
            "numbers the BatchNorm chapter printed (see docs/chapters/source.md). Without a norm the run is "
            "chaotic at lr 2.0: float rounding alone moves its last digits, so the fair comparison is where the "
            "chapter's number falls among normlab's runs over many seeds.")
    if notes:
        text += "\n\n" + "\n".join(f"- {n}" for n in notes)
    else:
        text += " (No study runs at lr 2.0 in this store to place it among.)"
    return {"title": "The chapter's runs (seed 123, lr 2.0, the chapter's loop)", "text": text,
            "tables": [(["model", "lr", "seed", "final train loss", "eval loss", "chapter's eval loss",
                         "eval accuracy", "chapter's eval accuracy"], rows)], "images": []}


def _stability_section(runs: list[dict], out: Path, info: dict | None = None) -> dict:
    from ._mlp import FAILURE_RULE, run_failure
    cells = _group(runs, "norm", "lr")
    norms, lrs = _order(k[0] for k in cells), sorted({k[1] for k in cells})
    acc_rows, fail_rows, acc_series, acc_runs, fail_series = [], [], {}, {}, {}
    lowest = 1.0
    for norm in norms:
        acc_row, fail_row = [_label(norm)], [_label(norm)]
        for lr in lrs:
            rs = cells.get((norm, lr), [])
            if not rs:
                acc_row.append("")
                fail_row.append("")
                continue
            accs = [r["final"]["eval_acc"] for r in rs]
            m, sd = summaries.mean_std(accs)
            why = [run_failure(r) for r in rs]
            d = sum(w is not None for w in why) / len(rs)
            counts = ", ".join(f"{why.count(k)} {k}" for k in ("non-finite", "chance", "loss") if why.count(k))
            finite = [a for a in accs if a is not None]
            span = f", {min(finite):.3f}..{max(finite):.3f}" if finite else ""
            acc_row.append(f"{summaries.pm(m, sd)}{span} (n={len(rs)})")
            fail_row.append(f"{d:.2f}" + (f" ({counts})" if counts else ""))
            acc_series.setdefault(_label(norm), []).append((lr, m))
            acc_runs.setdefault(_label(norm), []).append((lr, finite))
            fail_series.setdefault(_label(norm), []).append((lr, d))
            lowest = min([lowest] + finite)
        acc_rows.append(acc_row)
        fail_rows.append(fail_row)
    header = [f"lr {lr:g}" for lr in lrs]
    same = coinciding(fail_series)
    same_acc = coinciding(acc_series)
    images = [_plot_lines(out, "accuracy_vs_lr.png", acc_series, "learning rate", "final eval accuracy",
                          "accuracy vs learning rate: mean (line), each run (dots), min..max (bar)", logx=10,
                          runs=acc_runs, ylim=(max(0.0, min(lowest, 0.5) - 0.03), 1.0), info=info, chance=0.5),
              _plot_lines(out, "failed_vs_lr.png", fail_series, "learning rate", "fraction of runs that failed to train",
                          "failed to train vs learning rate", logx=10, ylim=(-0.04, 1.04), info=info)]
    at_lr = {norm: cells[(norm, CURVE_LR)] for norm in norms if (norm, CURVE_LR) in cells}
    if at_lr:
        images.insert(0, _plot_curves(out, at_lr, info))
    text = ("Final eval accuracy: mean ± std over weight seeds, then the lowest..highest run (n runs). "
            f"Then the fraction of runs that failed to train: {FAILURE_RULE}; in brackets, how many runs failed "
            "by each (the first that applies). The rule is applied to the stored loss curves and accuracies, "
            "so every run in the store is counted the same way. In the plots each learning rate is one "
            "step of the axis, its series side by side around it so that none hides another; the dotted "
            "line is chance (0.5).")
    if same or same_acc:
        pairs = "; ".join(f"{a} and {b}" for a, b in same)
        pairs_acc = "; ".join(f"{a} and {b}" for a, b in same_acc)
        text += (f" Equal at every learning rate (drawn side by side): {pairs or pairs_acc}"
                 + (" in the fraction that failed" if pairs else " in mean accuracy")
                 + (f"; {pairs_acc} in mean accuracy" if pairs and pairs_acc else "") + ".")
    return {"title": "Stability: the chapter's MLP on make_moons, full-batch SGD, 30 epochs", "text": text,
            "tables": [(["final eval accuracy"] + header, acc_rows), (["failed to train"] + header, fail_rows)],
            "images": images, "coinciding": {"failed": same, "accuracy": same_acc}}


def _batch_size_section(runs: list[dict], out: Path, info: dict | None = None) -> dict:
    cells = _group(runs, "norm", "batch_size")
    norms, sizes = _order(k[0] for k in cells), sorted({k[1] for k in cells})
    rows, series, each = [], {}, {}
    lowest = 1.0
    for norm in norms:
        row = [_label(norm)]
        for b in sizes:
            rs = cells.get((norm, b), [])
            if not rs:
                row.append("")
                continue
            accs = [r["final"]["test_acc"] for r in rs if r["final"]["test_acc"] is not None]
            m, sd = summaries.mean_std(accs)
            span = f", {min(accs):.3f}..{max(accs):.3f}" if accs else ""
            row.append(f"{summaries.pm(m, sd)}{span} (n={len(rs)})")
            series.setdefault(_label(norm), []).append((b, m))
            each.setdefault(_label(norm), []).append((b, accs))
            lowest = min([lowest] + accs)
        rows.append(row)
    img = _plot_lines(out, "accuracy_vs_batch_size.png", series, "batch size", "test accuracy (eval mode)",
                      "accuracy vs batch size: mean (line), each run (dots), min..max (bar)", logx=2, runs=each,
                      ylim=(max(0.0, lowest - 0.03), 1.0), info=info)
    return {"title": "Batch size: a small CNN on scikit-learn's digits",
            "text": "Test accuracy in eval mode on the held-out split: mean ± std over seeds, then the lowest..highest run (n runs).",
            "tables": [(["norm"] + [f"batch {b}" for b in sizes], rows)], "images": [img]}


def _train_eval_section(runs: list[dict], out: Path, info: dict | None = None) -> dict:
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
            m, s = summaries.mean_std(vals)
            row.append(f"{summaries.pm(m, s)}, {min(vals):.3f}..{max(vals):.3f} (n={len(rs)})")
            series.setdefault(_label(norm), []).append((mode, m, min(vals), max(vals)))
        rows.append(row)
    plt, fig, ax = _figure()
    width = 0.8 / max(1, len(series))
    for i, (label, pts) in enumerate(series.items()):
        xs = [modes.index(p[0]) + i * width for p in pts]
        # bars: the mean; whiskers: the lowest and highest run (inside [0, 1], unlike mean ± std)
        ax.bar(xs, [p[1] for p in pts], width, yerr=[[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]],
               capsize=3, label=label, hatch=["", "//", "..", "xx"][i % 4], edgecolor="white")
    for i, j in failed:                       # the layer raised: no bar, say so
        ax.text(j + i * width, 0.02, "raises", rotation=90, ha="center", va="bottom", fontsize=8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(modes))], modes, fontsize=8)
    ax.set(ylabel="test accuracy", title="eval mode vs train mode at batch size b: mean, min..max whiskers")
    ax.set_ylim(0, 1.0)
    facts: dict = {}
    img = _save(plt, fig, ax, out, "train_vs_eval_mode.png", facts)
    if info is not None:
        info[img] = facts
    return {"title": "Train mode vs eval mode at evaluation",
            "text": ("Accuracy of the same trained model evaluated in eval mode and in train mode on batches of "
                     "b test samples: mean ± std over seeds, then the lowest..highest run. An error is what the "
                     "layer raises."),
            "tables": [(["norm"] + modes, rows)], "images": [img]}


# --------------------------------------------------------------------------
# Writers
# --------------------------------------------------------------------------

def _md_table(header, rows) -> str:
    esc = lambda c: str(c).replace("|", "\\|")
    lines = ["| " + " | ".join(map(esc, header)) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(esc, r)) + " |" for r in rows])


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


STYLE = """
:root { color-scheme: light dark; }
body { font: 16px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; max-width: 60rem;
       margin: 0 auto; padding: 1rem; color: #1b1b1b; background: #fff; }
h1 { font-size: 1.6rem; } h2 { font-size: 1.3rem; margin-top: 2rem; border-bottom: 1px solid #ddd; }
code { font-size: .9em; background: #f3f3f3; padding: 0 .2em; border-radius: 3px; }
table { border-collapse: collapse; margin: 1rem 0; font-size: .85rem; display: block; overflow-x: auto;
        max-width: 100%; }
th, td { border: 1px solid #ccc; padding: .25em .5em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
img { max-width: 100%; height: auto; }
a { color: #1a4fb5; }
@media (max-width: 40rem) { body { font-size: 15px; padding: .5rem; } table { font-size: .75rem; } }
@media (prefers-color-scheme: dark) {
  body { color: #e8e8e8; background: #161616; } th, code { background: #2a2a2a; } a { color: #8ab4ff; }
  img { background: #fff; } }
@media print {
  body { max-width: none; padding: 0; font-size: 10pt; color: #000; background: #fff; }
  table { display: table; font-size: 8pt; } h2 { break-after: avoid; }
  img, table, tr { break-inside: avoid; }
  a { color: #000; } a[href^="runs.csv"]::after { content: " (" attr(href) ")"; } }
"""


def check_out(out) -> Path:
    """The report's folder, checked before any work; nothing is created. An existing folder
    or a new one (its parents are created too); an empty path, a file, a path under a file
    or a place that cannot be written (a read-only file system, a folder this user may not
    write to) raises ValueError with the reason."""
    text = "" if out is None else str(out)
    if not text.strip():
        raise ValueError("normlab report: --out must name a folder (e.g. --out normlab-report), got an empty path")
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"normlab report: --out {text} is an existing file, not a folder; give a folder path "
                         f"(e.g. --out normlab-report)")
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"normlab report: --out {text} lies under {parent}, which is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        if os.statvfs(parent).f_flag & os.ST_RDONLY:
            why = f"{parent} is on a read-only file system; give a folder on a writable one"
        else:
            import getpass
            why = f"{parent} is not writable for user {getpass.getuser()}; give a folder you can write to"
        raise ValueError(f"normlab report: cannot write into --out {text}: {why}")
    return path


def _make_out(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):       # can this user write here? (/proc says yes to access())
            pass
    except OSError as e:
        raise ValueError(f"normlab report: cannot write into --out {path}: {e.strerror or e}") from None


def to_html(md: str, out: Path) -> str:
    """``md`` rendered by Python-Markdown (the library the documentation site uses), with its
    images embedded as base64, and a stylesheet for screens of any width and for print."""
    import markdown
    body = markdown.markdown(md, extensions=["tables", "sane_lists"], output_format="html")

    def embed(m: re.Match) -> str:
        name = m.group(1)
        data = base64.b64encode((out / name).read_bytes()).decode()
        return f'src="data:image/png;base64,{data}"'

    body = re.sub(r'src="([A-Za-z0-9_.-]+\.png)"', embed, body)
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>normlab experiments report</title><style>{STYLE}</style></head>\n<body>\n{body}\n</body></html>\n")


def build(store: str, out: str) -> dict:
    """Write the report into ``out``; returns its sections (tables as data), its paths, and
    facts about its plots (``plots``: markers, line styles, legend and axes boxes)."""
    outp = check_out(out)
    with Store(store, read_only=True) as st:  # a report never writes to its store
        runs = st.runs()
    _make_out(outp)
    by_exp: dict[str, list[dict]] = {}
    for r in runs:
        by_exp.setdefault(r["experiment"], []).append(r)
    sections, plots = [], {}
    if by_exp.get("stability-chapter"):
        sections.append(_chapter_section(by_exp["stability-chapter"], by_exp.get("stability", [])))
    if by_exp.get("stability"):
        sections.append(_stability_section(by_exp["stability"], outp, plots))
    if by_exp.get("batch-size"):
        sections.append(_batch_size_section(by_exp["batch-size"], outp, plots))
    if by_exp.get("train-eval"):
        sections.append(_train_eval_section(by_exp["train-eval"], outp, plots))
    _write_csv(outp / "runs.csv", runs)
    head = (f"Every number below is read from the store `{store}` ({len(runs)} runs; "
            f"normlab {', '.join(sorted({r['normlab'] for r in runs}))}, torch {', '.join(sorted({r['torch'] for r in runs}))}). "
            "Every run, one row each: [runs.csv](runs.csv).")
    md = ["# normlab experiments report", "", head, ""]
    for s in sections:
        md += [f"## {s['title']}", "", s["text"], ""]
        for header, rows in s["tables"]:
            md += [_md_table(header, rows), ""]
        for img in s["images"]:
            md += [f"![{img}]({img})", ""]
    md_text = "\n".join(md)
    (outp / "report.md").write_text(md_text)
    (outp / "report.html").write_text(to_html(md_text, outp))
    files = ["report.md", "report.html", "runs.csv"] + [i for s in sections for i in s["images"]]
    return {"store": str(store), "out": str(outp), "runs": len(runs), "files": [os.path.join(str(outp), f) for f in files],
            "sections": [{"title": s["title"], "tables": s["tables"], "text": s["text"]} for s in sections],
            "plots": plots}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", type=arguments.arg(lambda s: str(check_path(s, read_only=True))), default=DEFAULT_STORE,
                   help=f"the store to report on (default {DEFAULT_STORE})")
    p.add_argument("--out", required=True, type=arguments.arg(lambda s: str(check_out(s))),
                   help="folder for report.md, report.html, the PNGs and runs.csv (created if missing)")


def run(out: str, store: str = DEFAULT_STORE) -> dict:
    return build(store, out)


def render(r: dict) -> str:
    lines = [f"report on {summaries.plural(r['runs'], 'run')} from {r['store']}:"]
    lines += [f"  {s['title']}" for s in r["sections"]] or ["  (no runs)"]
    lines += ["files:"] + [f"  {f}" for f in r["files"]]
    lines.append(f"open {os.path.join(r['out'], 'report.html')} (images embedded) or read {os.path.join(r['out'], 'report.md')}")
    return "\n".join(lines)
