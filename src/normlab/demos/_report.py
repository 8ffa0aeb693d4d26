"""Small helpers shared by the demos: chapter-style rounding and plain-text tables.

Formatting only; every number is computed in the demo's ``run()``.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch


def rounded(values: Iterable[float], ndigits: int) -> list[float]:
    """``[round(v, ndigits) for v in values]``, exactly what the chapters print."""
    return [round(v, ndigits) for v in values]


def fmt(values: Iterable[float], ndigits: int) -> str:
    """A list of floats as the chapters print it: ``repr`` of the rounded list."""
    return repr(rounded(values, ndigits))


def table(rows: Sequence[Sequence[object]], header: Sequence[str] | None = None, indent: int = 2) -> str:
    """Left-aligned columns separated by two spaces; ``header`` gets a dashed rule."""
    all_rows = [list(map(str, r)) for r in ([header] if header else []) + list(rows)]
    n_cols = max(len(r) for r in all_rows)
    widths = [max(len(r[i]) for r in all_rows if i < len(r)) for i in range(n_cols)]
    lines = []
    for k, r in enumerate(all_rows):
        lines.append(" " * indent + "  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip())
        if header and k == 0:
            lines.append(" " * indent + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """``(a - b).abs().max().item()``."""
    return (a - b).abs().max().item()


def yes_no(flag: bool) -> str:
    return "yes" if flag else "no"
