"""Plot plumbing for ``normlab figures``: a Figure without pyplot, saved as PNG.

matplotlib's object API (``matplotlib.figure.Figure``) needs no global backend and
no display, so drawing works in any process (a docs build, a test worker).
"""

from __future__ import annotations

from pathlib import Path

DPI = 110


def new_figure(width: float, height: float):
    """A blank ``matplotlib.figure.Figure`` of ``width`` x ``height`` inches."""
    from matplotlib.figure import Figure
    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def save(fig, path: str | Path) -> Path:
    """Write ``fig`` as a PNG at ``path``; returns the path."""
    path = Path(path)
    fig.savefig(path, format="png", dpi=DPI)
    return path


def labels(fig) -> dict:
    """What a reader sees first, for the tests: the title and every axis's labels and legend."""
    axes = []
    for ax in fig.axes:
        leg = ax.get_legend()
        zlabel = ax.get_zlabel() if hasattr(ax, "get_zlabel") else ""
        axes.append({"title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
                     "zlabel": zlabel, "legend": [t.get_text() for t in leg.get_texts()] if leg else []})
    sup = fig.get_suptitle() if hasattr(fig, "get_suptitle") else (fig._suptitle.get_text() if fig._suptitle else "")
    legends = [[t.get_text() for t in leg.get_texts()] for leg in fig.legends]
    return {"suptitle": sup, "axes": axes, "figure_legends": legends}
