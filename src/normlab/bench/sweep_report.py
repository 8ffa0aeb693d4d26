"""The sweep's report (``normlab bench --suite sweep``): its CSV, the worst cells, the geometric
means, the one-line summary and the PNG. The draw and the run are in :mod:`normlab.bench.sweep`."""

from __future__ import annotations

import io
import math
import os
from collections.abc import Iterable, Mapping, Sequence

from .chapters_data import FIELDS as CHAPTER_FIELDS, _table, write_csv as _write_csv
from .report import ratio_and_times

FIELDS = ("cell", "family", *[f for f in CHAPTER_FIELDS if f not in ("torch_runs_per_s", "normlab_runs_per_s", "data")],
          "numel", "mbytes", "x_torch_first", "reruns", "load1", "seed", "spec")
FAMILY_ORDER = ("layer_norm", "rms_norm", "batch_norm", "group_norm", "instance_norm", "layer_norm2d")
_COLORS = {"layer_norm": "tab:blue", "rms_norm": "tab:cyan", "batch_norm": "tab:red", "group_norm": "tab:green",
           "instance_norm": "tab:purple", "layer_norm2d": "tab:orange"}
_MARKERS = {"fwd": "o", "fwd+bwd": "^", "eval fwd": "s", "eval fwd+bwd": "D"}


def write_csv(rows: Sequence[dict], path: str) -> None:
    _write_csv(rows, path, FIELDS)


def _ok(rows: Iterable[Mapping]) -> list[Mapping]:
    return [r for r in rows if r["status"] == "ok" and r.get("x_torch")]


def worst(rows: Iterable[Mapping], n: int) -> list[Mapping]:
    """The ``n`` measured cells with the lowest ``x_torch``, slowest first (ties: draw order)."""
    return sorted(_ok(rows), key=lambda r: (r["x_torch"], int(r["cell"])))[:n]


def geomean(values: Iterable[float]) -> float | None:
    vals = [math.log(v) for v in values]
    return math.exp(sum(vals) / len(vals)) if vals else None


def geomeans(rows: Iterable[Mapping]) -> dict[tuple, tuple[float, int]]:
    """``{(family, layout, threads): (geometric mean of x_torch, cells)}``; ``"all"`` in a field
    pools it (``("all", "all", "all")`` is the overall mean)."""
    ok = _ok(rows)
    groups: dict[tuple, list[float]] = {}
    for r in ok:
        for fam in (r["family"], "all"):
            for lay in (r["layout"], "all"):
                for thr in (str(r["threads"]), "all"):
                    groups.setdefault((fam, lay, thr), []).append(r["x_torch"])
    return {k: (geomean(v), len(v)) for k, v in groups.items()}


def _where(r: Mapping) -> str:
    lay = " cl" if r["layout"] == "channels_last" else ""
    return f"{r['layer']} {r['shape']}{lay} {r['dtype']} t{r['threads']} {r['mode']}"


def summary(rows: Sequence[Mapping]) -> str:
    """The verdict in one line: cells >= 1.0x and below 0.9x, the geometric means, the worst cell."""
    ok = _ok(rows)
    if not ok:
        return f"sweep: no cell measured ({len(rows)} failed)" if rows else "sweep: no cell measured"
    g = geomeans(ok)
    per_t = ", ".join(f"t{t} {g[('all', 'all', t)][0]:.2f}x" for t in sorted({str(r['threads']) for r in ok}))
    slow = worst(ok, 1)[0]
    failed = f"; {len(rows) - len(ok)} cells failed" if len(ok) < len(rows) else ""
    return (f"sweep: {sum(r['x_torch'] >= 1.0 for r in ok)} of {len(ok)} cells >= 1.0x, "
            f"{sum(r['x_torch'] < 0.9 for r in ok)} below 0.9x; geometric mean {g[('all', 'all', 'all')][0]:.2f}x "
            f"({per_t}); worst {slow['x_torch']:.2f}x ({_where(slow)}){failed}")


def make_tables(rows: Sequence[Mapping], worst_n: int = 15) -> list:
    """``rich`` tables: the worst cells, then the geometric means per family and layout by threads."""
    tables = []
    if worst_n:
        t = _table(f"normlab bench --suite sweep: the {len(worst(rows, worst_n))} worst cells",
                   "cell|layer|shape|dtype|thr|mode|MiB|torch|normlab|×torch|first",
                   "×torch = torch time / normlab time (median); first: the ratio before --rerun-worst")
        for r in worst(rows, worst_n):
            ratio, times = ratio_and_times(r)
            shape = r["shape"] + (" cl" if r["layout"] == "channels_last" else "")
            first = "" if r.get("x_torch_first") is None else f"{r['x_torch_first']:.2f}"
            t.add_row(str(r["cell"]), r["layer"], shape, r["dtype"], str(r["threads"]), r["mode"],
                      f"{r['mbytes']:.3g}", *times, ratio, first)
        tables.append(t)
    g = geomeans(rows)
    threads = sorted({k[2] for k in g if k[2] != "all"})
    t = _table("geometric mean of ×torch (cells)", "|".join(["family", "layout", *[f"t{x}" for x in threads], "all"]))
    for column in t.columns[:2]:
        column.justify = "left"
    keys = sorted({k[:2] for k in g}, key=lambda k: (k[0] == "all", FAMILY_ORDER.index(k[0]) if k[0] in FAMILY_ORDER
                                                     else 99, k[1] == "all", k[1]))
    for fam, lay in keys:
        if fam != "all" and lay == "all" and sum((fam, x, "all") in g for x in ("contiguous", "channels_last")) < 2:
            continue  # a family measured in one layout: its "all" row repeats that layout's
        cells = []
        for thr in [*threads, "all"]:
            v = g.get((fam, lay, thr))
            cells.append("" if v is None else f"{v[0]:.2f} ({v[1]})")
        if fam == "all" and lay == "all":
            t.add_section()
        t.add_row(fam, lay, *cells)
    if g:
        tables.append(t)
    return tables


def _footer(result: Mapping) -> list[str]:
    files = result["files"]
    lines = [f"warning: {w}" for w in result.get("warnings", [])]
    lines += [result["summary"], f"files: {', '.join([files['csv'], files['json'], *files['png']])}"]
    if result["interrupted"]:
        lines.append("interrupted: the files hold every cell finished before Ctrl-C; continue with --resume")
    return lines


def render(result: Mapping, width: int = 160) -> str:
    """The result as plain text: the tables, the summary line, the files."""
    from rich.console import Console

    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=False, color_system=None)
    for table in make_tables(result["rows"], result.get("worst_n", 15)):
        con.print(table)
    return buf.getvalue().rstrip("\n") + "\n" + "\n".join(_footer(result))


def print_result(result: Mapping, console=None) -> None:
    from rich.console import Console

    console = console or (Console() if Console().is_terminal else Console(width=160))
    for table in make_tables(result["rows"], result.get("worst_n", 15)):
        console.print(table)
    for line in _footer(result):
        console.print(line, highlight=False, soft_wrap=True)


def write_png(rows: Sequence[Mapping], path: str) -> list[str]:
    """``x_torch`` against the input's size: a colour per family, a marker per mode, a panel per
    (layout, threads); lines at 1.0 and 0.9. Returns ``[path]``, or ``[]`` when nothing was measured."""
    ok = _ok(rows)
    if not ok:
        return []
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    layouts = [x for x in ("contiguous", "channels_last") if any(r["layout"] == x for r in ok)]
    threads = sorted({int(r["threads"]) for r in ok})
    fig = Figure(figsize=(6.0 * len(threads), 4.0 * len(layouts)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(layouts), len(threads), squeeze=False, sharex=True, sharey=True)
    lo, hi = min(r["x_torch"] for r in ok), max(r["x_torch"] for r in ok)
    for i, lay in enumerate(layouts):
        for j, thr in enumerate(threads):
            ax = axes[i][j]
            for fam in FAMILY_ORDER:
                for mode, marker in _MARKERS.items():
                    pts = [(r["mbytes"], r["x_torch"]) for r in ok
                           if (r["layout"], int(r["threads"]), r["family"], r["mode"]) == (lay, thr, fam, mode)]
                    if pts:
                        ax.scatter(*zip(*pts), s=14, marker=marker, color=_COLORS[fam], alpha=0.75)
            ax.axhline(1.0, color="black", lw=0.8)
            ax.axhline(0.9, color="black", lw=0.6, ls="--")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_ylim(min(lo, 0.8) / 1.1, max(hi, 2.0) * 1.1)
            ax.set_title(f"{lay}, {thr} thread{'s' if thr != 1 else ''}", fontsize=9)
            ax.set_xlabel("size of x (MiB)", fontsize=8)
            ax.set_ylabel("torch time / normlab time", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(True, which="both", alpha=0.3)
    from matplotlib.lines import Line2D

    dot = (lambda marker, color, label: Line2D([], [], ls="", marker=marker, color=color, label=label))
    fams = [f for f in FAMILY_ORDER if any(r["family"] == f for r in ok)]
    modes = [m for m in _MARKERS if any(r["mode"] == m for r in ok)]
    fig.legend(handles=[dot("o", _COLORS[f], f) for f in fams] + [dot(_MARKERS[m], "gray", m) for m in modes],
               fontsize=7, loc="outside right upper")
    g = geomeans(ok)[("all", "all", "all")][0]
    # two lines, so that the title fits a single panel's width (one line was cut at both ends)
    fig.suptitle(f"normlab bench --suite sweep\n{len(ok)} cells, geometric mean {g:.2f}x torch.nn", fontsize=10)
    tmp = f"{path}.tmp{os.getpid()}.png"
    fig.savefig(tmp, dpi=90)
    os.replace(tmp, path)
    return [path]
