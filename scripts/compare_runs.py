"""What scripts/compare-chapters.py and scripts/compare-large-rows.py share: two Python
interpreters (two environments, or two trees: a wrapper script that sets PYTHONPATH is an
interpreter too) given as --base and --new, runs alternating between them (base then new, run
1, 2, ...), each a fresh process whose result is kept in --out so that an interrupted comparison
resumes, and per row the medians over the runs and their ratio.

Imported by the two scripts (their folder is the first entry of sys.path when they run)."""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
from collections.abc import Callable

WHO = ("base", "new")  # the order of the two runs of each round


def arguments(doc: str, runs: int, out: str, out_help: str, exe_hint: str = "") -> argparse.Namespace:
    """The command line (--base, --new, --runs, --out; the description: doc's first paragraph),
    checked: at least one run, both interpreters files, --out not a file. --out is created and
    comes back as a pathlib.Path. exe_hint ends the message for a missing interpreter."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="Python of the environment compared against")
    ap.add_argument("--new", required=True, help="Python of the environment measured")
    ap.add_argument("--runs", type=int, default=runs, help=f"runs per environment, alternating (default {runs})")
    ap.add_argument("--out", default=out, help=f"{out_help} (default {out})")
    a = ap.parse_args()
    if a.runs < 1:
        ap.error(f"--runs: expected at least 1 run, got {a.runs}")
    for flag, exe in (("--base", a.base), ("--new", a.new)):
        if not pathlib.Path(exe).is_file():
            ap.error(f"{flag}: no Python interpreter at {exe!r}{exe_hint}")
    a.out = pathlib.Path(a.out)
    if a.out.exists() and not a.out.is_dir():
        ap.error(f"--out: {a.out} is a file; give a folder (created if missing)")
    a.out.mkdir(parents=True, exist_ok=True)
    return a


def alternate(a: argparse.Namespace, done: Callable[[str, int], bool], run: Callable[[str, int, str], int]) -> int:
    """Runs 1..a.runs, base then new in each: run(who, i, python) for each one not done(who, i)
    (finished in an earlier, interrupted comparison), announced on standard error. run returns
    the process's exit status; the first non-zero one stops the comparison and is returned."""
    for i in range(1, a.runs + 1):
        for who in WHO:
            if done(who, i):
                continue
            print(f"run {i}/{a.runs} {who}", file=sys.stderr, flush=True)
            rc = run(who, i, getattr(a, who))
            if rc != 0:
                return rc
    return 0


def results(a: argparse.Namespace, load: Callable[[str, int], dict]) -> tuple[list[dict], list[dict]]:
    """Each run's rows, load(who, i), for base and for new (lists in run order)."""
    return tuple([load(who, i) for i in range(1, a.runs + 1)] for who in WHO)  # type: ignore[return-value]


def medians(b: list[float], n: list[float]) -> tuple[float, float, float, float]:
    """A row's base and new medians over the runs, and the lowest and highest per-run ratio
    new / base (run i of new over run i of base)."""
    ratios = [y / x for x, y in zip(b, n)]
    return statistics.median(b), statistics.median(n), min(ratios), max(ratios)
