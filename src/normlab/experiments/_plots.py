"""The report's plots (matplotlib, Agg backend): every series visible (its own marker and
line style, series side by side around each x value), spreads drawn as the runs themselves
and their min..max (never a mean ± std bar outside what the quantity can take), values of a
log scale (learning rates, batch sizes) one step apart at ticks labelled with them, the legend
outside the axes. Each drawing
function can fill ``info`` with facts the tests check (markers, styles, boxes, ticks)."""

from __future__ import annotations

from pathlib import Path

STYLES = [("o", "-"), ("s", "--"), ("^", "-."), ("D", ":"), ("v", (0, (5, 1, 1, 1))), ("P", (0, (1, 1))),
          ("X", (0, (3, 1, 1, 1, 1, 1)))]


def _figure():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7.2, 4.0), dpi=110)
    return plt, fig, ax


def _save(plt, fig, ax, out: Path, name: str, info: dict | None = None) -> str:
    ax.grid(True, alpha=0.3)
    # outside the axes, right: it never covers a curve
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    fig.savefig(out / name)
    if info is not None:
        info.update(_figure_facts(fig, ax))
    plt.close(fig)
    return name


def _figure_facts(fig, ax) -> dict:
    """What the tests check about a drawn figure: legend and axes boxes, tick labels."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    leg = ax.get_legend()
    return {"axes_box": tuple(ax.get_window_extent(r).bounds),
            "legend_box": tuple(leg.get_window_extent(r).bounds) if leg else None,
            "xticks": [t.get_text() for t in ax.get_xticklabels() if t.get_text()]}


def _tick_label(v) -> str:
    return f"{v:g}"


def _offsets(n: int, spread: float = 0.08) -> list[float]:
    """Per series, a shift in units of one step between x values, that keeps markers at the
    same x from hiding one another (at most 0.2 of a step either side)."""
    mid = (n - 1) / 2
    step = min(spread, 0.4 / max(1, n - 1))
    return [((i - mid) * step) for i in range(n)] if n > 1 else [0.0]


def _place(x, k: float, step: dict | None):
    """Where a value of x is drawn: its step (log-scale values) or itself, plus its series' shift."""
    return (step[x] if step else x) + k


def coinciding(series: dict) -> list[tuple[str, str]]:
    """Pairs of series whose y values are equal at every x (drawn apart, and named in a note)."""
    names = list(series)
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            pa, pb = {p[0]: p[1] for p in series[a]}, {p[0]: p[1] for p in series[b]}
            if pa.keys() == pb.keys() and all(
                    (pa[x] is None and pb[x] is None) or (pa[x] is not None and pb[x] is not None
                                                          and abs(pa[x] - pb[x]) < 1e-12) for x in pa):
                out.append((a, b))
    return out


def _plot_lines(out: Path, name: str, series: dict, xlabel: str, ylabel: str, title: str, logx: int = 0,
                runs: dict | None = None, ylim: tuple | None = None, info: dict | None = None,
                chance: float | None = None) -> str:
    """``series``: {label: [(x, y)]}, drawn as lines; ``runs``: {label: [(x, [values])]},
    each run a small dot with a min..max bar; ``logx``: the x values are steps of a log scale
    (0: a linear axis). Such values are drawn one step apart, each at its own tick, and the
    series side by side within 0.2 of a step of it: on a log axis a nudge wide enough to
    separate the markers read as another value (lr 2 as 1.7..2.3). Each series has its own
    marker and line style; ``chance``: a dotted line at that accuracy."""
    plt, fig, ax = _figure()
    xs_used = sorted({p[0] for pts in series.values() for p in pts})
    step = {x: i for i, x in enumerate(xs_used)} if logx else None
    shift = _offsets(len(series)) if logx else _offsets(len(series), 0.06)
    facts = {"series": {}}
    for i, (label, pts) in enumerate(series.items()):
        marker, style = STYLES[i % len(STYLES)]
        xs = [_place(p[0], shift[i], step) for p in pts]
        ys = [float("nan") if p[1] is None else p[1] for p in pts]
        line, = ax.plot(xs, ys, marker=marker, linestyle=style, label=label, markersize=6, linewidth=1.4,
                        zorder=3)
        lows, highs = [], []
        for x, vals in (runs or {}).get(label, []):
            vals = [v for v in vals if v is not None]
            if not vals:
                continue
            xp = _place(x, shift[i], step)
            ax.vlines(xp, min(vals), max(vals), color=line.get_color(), alpha=0.5, linewidth=1, zorder=2)
            ax.scatter([xp] * len(vals), vals, s=9, color=line.get_color(), alpha=0.6, marker=marker,
                       linewidths=0, zorder=2)
            lows.append(min(vals))
            highs.append(max(vals))
        facts["series"][label] = {"marker": marker, "linestyle": str(style), "x": xs,
                                  "low": min(lows) if lows else None, "high": max(highs) if highs else None}
    if chance is not None:
        ax.axhline(chance, color="0.35", linestyle=":", linewidth=1.2, zorder=1, label=f"chance ({chance:g})")
        facts["chance"] = chance
    if logx:
        ax.set_xticks(range(len(xs_used)), [_tick_label(v) for v in xs_used])
        ax.set_xlim(-0.5, len(xs_used) - 0.5)
        ax.minorticks_off()
        facts["ticks"] = {_tick_label(v): i for i, v in enumerate(xs_used)}
    if ylim:
        ax.set_ylim(*ylim)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    name = _save(plt, fig, ax, out, name, facts)
    if info is not None:
        info[name] = facts
    return name
