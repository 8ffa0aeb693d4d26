"""Rows, files and pictures of ``normlab bench``: the rich table, CSV, JSON and PNG.

One row per (case, threads, mode, provider). Derived columns, computed within
the group of providers measured together (same process, same tensors,
interleaved):

- ``gbps``: minimal bytes of the op / median time, in GB/s (1e9 bytes).
- ``vs_torch`` / ``vs_compile``: speed-up over torch eager / ``torch.compile``
  (``t_torch / t``); above 1 is faster.
- ``of_limit``: fraction of the copy limit (``t_limit / t``); 1 means the op runs
  as fast as a plain copy moving its minimal bytes.

Files are rewritten whole after each group (to a temporary name, then renamed),
so an interrupted run leaves complete files holding every finished group.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence

from .cases import MODES, OPS, PROVIDERS, Case, shape_str, traffic

FIELDS = (
    "op", "layout", "shape", "numel", "dtype", "threads", "mode", "provider",
    "status", "reason", "median_s", "min_s", "repeats", "inner", "first_call_s",
    "bytes", "gbps", "vs_torch", "vs_compile", "of_limit",
)
KEY_FIELDS = ("op", "layout", "shape", "dtype", "threads", "mode", "provider")
_INT_FIELDS = ("numel", "threads", "repeats", "inner", "bytes")
_FLOAT_FIELDS = ("median_s", "min_s", "first_call_s", "gbps", "vs_torch", "vs_compile", "of_limit")

CSV_NAME = "bench.csv"
JSON_NAME = "bench.json"


def row_key(row: Mapping) -> tuple:
    """The identity of a row: a resumed run skips and replaces rows by this key."""
    return tuple(str(row[f]) for f in KEY_FIELDS)


def group_rows(case: Case, threads: int, mode: str, n_bytes: int, timings: Mapping) -> list[dict]:
    """Rows of one measured group (``timings``: provider -> ``timing.Timing``)."""
    def t(p):
        tm = timings.get(p)
        return tm.median_s if tm is not None and tm.status == "ok" else None

    rows = []
    for provider, tm in timings.items():
        med = tm.median_s if tm.status == "ok" else None
        rows.append({
            "op": case.op, "layout": case.layout, "shape": shape_str(case.shape),
            "numel": math.prod(case.shape), "dtype": case.dtype, "threads": threads,
            "mode": mode, "provider": provider, "status": tm.status, "reason": tm.reason,
            "median_s": med, "min_s": tm.min_s if med is not None else None,
            "repeats": len(tm.samples), "inner": tm.inner, "first_call_s": tm.first_call_s,
            "bytes": n_bytes,
            "gbps": n_bytes / med / 1e9 if med else None,
            "vs_torch": t("torch") / med if med and t("torch") else None,
            "vs_compile": t("compile") / med if med and t("compile") else None,
            "of_limit": t("limit") / med if med and t("limit") else None,
        })
    return rows


def merge_rows(old: Sequence[dict], new: Sequence[dict]) -> list[dict]:
    """``old`` with ``new`` added; a new row replaces an old one with the same key."""
    fresh = {row_key(r) for r in new}
    return [r for r in old if row_key(r) not in fresh] + list(new)


# --------------------------------------------------------------------------
# CSV / JSON
# --------------------------------------------------------------------------

def _atomic_write(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", newline="") as f:
        f.write(text)
    os.replace(tmp, path)


def write_csv(rows: Sequence[dict], path: str) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FIELDS, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in FIELDS})
    _atomic_write(path, buf.getvalue())


def write_json(rows: Sequence[dict], meta: Mapping, path: str) -> None:
    _atomic_write(path, json.dumps({"meta": dict(meta), "rows": list(rows)}, indent=1) + "\n")


def _typed(row: Mapping) -> dict:
    out = {}
    for k in FIELDS:
        v = row.get(k, "")
        if v in ("", None):
            v = None if k not in ("reason", "layout") else (v or "")
        elif k in _INT_FIELDS:
            v = int(float(v))
        elif k in _FLOAT_FIELDS:
            v = float(v)
        out[k] = v
    return out


def read_rows(out_dir: str) -> list[dict]:
    """Rows already in ``out_dir``: from the JSON file, else from the CSV file, else none."""
    jpath, cpath = os.path.join(out_dir, JSON_NAME), os.path.join(out_dir, CSV_NAME)
    if os.path.exists(jpath):
        try:
            with open(jpath) as f:
                return [_typed(r) for r in json.load(f)["rows"]]
        except (ValueError, KeyError, TypeError):
            pass  # damaged: fall back to the CSV
    if os.path.exists(cpath):
        with open(cpath, newline="") as f:
            return [_typed(r) for r in csv.DictReader(f)]
    return []


# --------------------------------------------------------------------------
# Table
# --------------------------------------------------------------------------

def fmt_time(s: float | None) -> str:
    if s is None:
        return ""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def _fmt(v: float | None, spec: str) -> str:
    return "" if v is None else format(v, spec)


def _index(seq: Sequence, v) -> int:
    return seq.index(v) if v in seq else len(seq)


_LAYOUTS = ("contiguous", "channels_last")


def _sort_key(row: Mapping):
    return (_index(OPS, row["op"]), row["numel"] or 0, row["shape"], _index(_LAYOUTS, row["layout"]),
            row["dtype"], row["threads"], _index(MODES, row["mode"]), _index(PROVIDERS, row["provider"]))


def sorted_rows(rows: Iterable[Mapping]) -> list[Mapping]:
    return sorted(rows, key=_sort_key)


_MIN_WIDTH = {"op": 16, "layout": 13, "shape": 13, "thr": 3, "mode": 16, "provider": 11,
              "time": 8, "GB/s": 5, "×compile": 8, "1st call": 8}


def make_table(rows: Sequence[Mapping], title: str = "normlab bench"):
    """A ``rich.table.Table`` of ``rows``, one section per group; footnotes for n/a and errors."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title, show_lines=False, pad_edge=False)
    for name, just in (("op", "left"), ("layout", "left"), ("shape", "left"), ("dtype", "left"),
                       ("thr", "right"), ("mode", "left"), ("provider", "left"), ("time", "right"),
                       ("GB/s", "right"), ("×torch", "right"), ("×compile", "right"),
                       ("of limit", "right"), ("1st call", "right")):
        table.add_column(name, justify=just, no_wrap=True,
                         min_width=_MIN_WIDTH.get(name))
    notes: dict[str, int] = {}
    last_group = None
    for r in sorted_rows(rows):
        group = row_key(r)[:-1]
        if last_group is not None and group != last_group:
            table.add_section()
        same = last_group is not None and group == last_group
        last_group = group
        if r["status"] == "ok":
            time_cell = fmt_time(r["median_s"])
        else:
            n = notes.setdefault(f"{r['provider']}: {r['reason']}", len(notes) + 1)
            time_cell = escape(f"{r['status']} [{n}]")
        style = "bold" if r["provider"] == "normlab-cpu" else ("dim" if r["provider"] == "limit" else None)
        head = ["", "", "", "", "", ""] if same else [
            r["op"], "" if r["layout"] == "contiguous" else r["layout"], r["shape"], r["dtype"],
            str(r["threads"]), r["mode"]]
        table.add_row(
            *head, r["provider"], time_cell, _fmt(r["gbps"], ".3g"),
            _fmt(r["vs_torch"], ".2f"), _fmt(r["vs_compile"], ".2f"),
            "" if r["of_limit"] is None else f"{r['of_limit']:.0%}",
            fmt_time(r["first_call_s"]), style=style,
        )
    caption = [("time: median per call; GB/s: minimal bytes / time; ×torch, ×compile: speed-up "
                "(>1 faster); of limit: copy-limit time / time; 1st call: compile/cache load + first run")]
    caption += [escape(f"[{n}] {text}") for text, n in notes.items()]
    table.caption = "\n".join(caption)
    table.caption_justify = "left"
    return table


def render_table(rows: Sequence[Mapping], width: int = 180, title: str = "normlab bench") -> str:
    """The table as plain text (for ``render`` and logs)."""
    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=width, force_terminal=False, color_system=None).print(
        make_table(rows, title=title))
    return buf.getvalue().rstrip("\n")


# --------------------------------------------------------------------------
# PNG
# --------------------------------------------------------------------------

_COLORS = {"normlab-cpu": "tab:red", "normlab-ref": "tab:orange", "torch": "tab:blue",
           "compile": "tab:green", "limit": "black"}


def write_png(rows: Sequence[Mapping], out_dir: str) -> list[str]:
    """GB/s per provider: one PNG per (dtype, threads). When some (op, layout) was measured at
    three sizes or more, GB/s against input size, a panel per (op, layout) and mode; otherwise
    (a run at one or two sizes, as ``--quick``) one panel per mode with a group of bars per
    case, so a few points are not spread over dozens of near-empty panels. The legend is the
    figure's, above every panel. Uses matplotlib's Agg canvas directly (no pyplot, no global
    backend switch). Returns the paths written."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ok = [r for r in rows if r["status"] == "ok" and r["gbps"]]
    paths = []
    for dtype, threads in sorted({(r["dtype"], r["threads"]) for r in ok}):
        sel = [r for r in ok if r["dtype"] == dtype and r["threads"] == threads]
        panels = sorted({(r["op"], r["layout"]) for r in sel},
                        key=lambda p: (_index(OPS, p[0]), _index(_LAYOUTS, p[1])))
        modes = [m for m in MODES if any(r["mode"] == m for r in sel)]
        sizes = max(len({r["shape"] for r in sel if (r["op"], r["layout"]) == p}) for p in panels)
        fig = Figure(layout="constrained")
        FigureCanvasAgg(fig)
        if sizes >= 3:
            _draw_lines(fig, sel, panels, modes)
        else:
            _draw_bars(fig, sel, modes)
        handles = {}
        for ax in fig.axes:
            for h, label in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(label, h)
        fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncols=len(handles), fontsize=8)
        fig.suptitle(f"normlab bench — {dtype}, {threads} thread{'s' if threads != 1 else ''}")
        path = os.path.join(out_dir, f"gbps_{dtype}_t{threads}.png")
        tmp = path + f".tmp{os.getpid()}.png"
        fig.savefig(tmp, dpi=90)
        os.replace(tmp, path)
        paths.append(path)
    return paths


def _draw_lines(fig, sel: list, panels: list, modes: list) -> None:
    fig.set_size_inches(4.2 * len(modes), 3.0 * len(panels) + 0.6)
    axes = fig.subplots(len(panels), len(modes), squeeze=False)
    for i, (op, layout) in enumerate(panels):
        for j, mode in enumerate(modes):
            ax = axes[i][j]
            for provider in PROVIDERS:
                pts = sorted((r["bytes"] / max(1, _rw(r)), r["gbps"]) for r in sel
                             if (r["op"], r["layout"], r["mode"], r["provider"]) == (op, layout, mode, provider))
                if pts:
                    ax.plot(*zip(*pts), marker="o", ms=3, label=provider, color=_COLORS.get(provider),
                            ls="--" if provider == "limit" else "-")
            ax.set_xscale("log")
            ax.set_title(f"{op}{'' if layout == 'contiguous' else ' ' + layout} — {mode}", fontsize=9)
            ax.set_xlabel("size of x (bytes)", fontsize=8)
            ax.set_ylabel("GB/s (minimal bytes)", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(True, which="both", alpha=0.3)


def _draw_bars(fig, sel: list, modes: list) -> None:
    """A panel per mode; a row per case (op, layout, shape), one bar per provider."""
    cases = sorted({(r["op"], r["layout"], r["shape"]) for r in sel},
                   key=lambda c: (_index(OPS, c[0]), _index(_LAYOUTS, c[1]), c[2]))
    providers = [p for p in PROVIDERS if any(r["provider"] == p for r in sel)]
    fig.set_size_inches(5.0 * len(modes), 0.32 * len(cases) * len(providers) + 1.6)
    axes = fig.subplots(1, len(modes), squeeze=False, sharey=True)[0]
    height = 0.8 / len(providers)
    for ax, mode in zip(axes, modes):
        for k, provider in enumerate(providers):
            got = {(r["op"], r["layout"], r["shape"]): r["gbps"] for r in sel
                   if r["mode"] == mode and r["provider"] == provider}
            ys = [i + (k - (len(providers) - 1) / 2) * height for i, c in enumerate(cases) if c in got]
            ax.barh(ys, [got[c] for c in cases if c in got], height=height, label=provider,
                    color=_COLORS.get(provider), hatch="//" if provider == "limit" else None,
                    alpha=0.55 if provider == "limit" else 1.0)
        ax.set_yticks(range(len(cases)),
                      [f"{op}{'' if lay == 'contiguous' else ' ' + lay}\n{shape}" for op, lay, shape in cases], fontsize=8)
        ax.set_title(mode, fontsize=10)
        ax.set_xlabel("GB/s (minimal bytes / median time; higher is faster)", fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(True, axis="x", alpha=0.3)
    axes[0].invert_yaxis()  # the first case on top (the axes share it: once)


def _rw(row: Mapping) -> int:
    """Reads + writes of the row's op/mode (bytes / this = size of x)."""
    return sum(traffic(row["op"], row["mode"]))


def ratio_and_times(r: dict) -> tuple[str, list[str]]:
    """A module-call row's "×torch" cell (green from 1.0 up, red below) and its two time cells
    (torch's, normlab's), or the reason it has no numbers."""
    from rich.markup import escape

    if r["status"] != "ok":
        return "", [escape(f"{r['status']}: {r['reason']}"[:60]), ""]
    x = r["x_torch"]
    ratio = f"[green]{x:.2f}[/]" if x >= 1.0 else f"[red]{x:.2f}[/]"
    return ratio, [fmt_time(r["torch_us"] * 1e-6), fmt_time(r["normlab_us"] * 1e-6)]
