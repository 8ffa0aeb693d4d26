"""How the experiments summarise what they ran: counts in words, mean and spread, the speed line."""

from __future__ import annotations

import math
import statistics
from typing import Any, Sequence


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 torch thread``, ``2 torch threads``."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (0 for a single value) of the finite values."""
    v = [x for x in values if x is not None and math.isfinite(x)]
    if not v:
        return None, None
    return statistics.fmean(v), (statistics.stdev(v) if len(v) > 1 else 0.0)


def finite_or_none(x: Any) -> Any:
    """JSON-safe: NaN and infinities become None (recursively)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite_or_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_or_none(v) for v in x]
    return x


def pm(mean: float | None, std: float | None, nd: int = 3) -> str:
    return "n/a" if mean is None else f"{mean:.{nd}f} ± {std:.{nd}f}"


def speed_line(info: dict, skipped: int) -> str:
    if info["ran"] == 0:
        return f"all {plural(skipped, 'run')} {'was' if skipped == 1 else 'were'} already in the store; nothing trained (delete the store or use --store NEW to re-run)"
    rate = info["ran"] / info["wall_s"] if info["wall_s"] > 0 else float("inf")
    how = f"{plural(info['workers'], 'process', 'processes')} x {plural(info['threads'], 'torch thread')}"
    return (f"trained {plural(info['ran'], 'run')} in {info['wall_s']:.2f} s = {rate:.1f} runs/s ({how}, "
            f"executor {info['executor']}); {plural(skipped, 'run')} already stored "
            f"{'was' if skipped == 1 else 'were'} skipped")
