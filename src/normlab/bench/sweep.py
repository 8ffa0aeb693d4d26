"""``normlab bench --suite sweep``: normlab.nn against torch.nn on shapes drawn across the space users have.

The fixed suites time the shapes normlab was tuned on; this one draws its cells at random
(seeded) so that a weak region shows up wherever it is:

- row norms (``LayerNorm``, ``RMSNorm``): ``(rows, hidden)``, rows 1..8192 and hidden
  16..16384, each log-uniform (hidden rounded to a multiple of 64 half of the time);
- image norms (``BatchNorm2d/3d``, ``GroupNorm``, ``InstanceNorm2d/3d``, ``LayerNorm2d``):
  batch 1..64, channels 1..512 (a common count such as 3, 64, 384 most of the time, else any),
  spatial 7x7..512x512 (square 70 % of the time), a 3-D volume (depth 2..64, side 7..256) for
  30 % of the BatchNorm/GroupNorm/InstanceNorm cells; contiguous or channels_last
  (``channels_last_3d`` for 5-D: the row's layout says ``channels_last`` for both);
- modes ``fwd`` (training forward: the graph is built, BatchNorm's statistics updated),
  ``fwd+bwd`` (then ``y.backward(dy)``), ``eval fwd`` (``module.eval()`` under
  ``torch.no_grad()``) and, for BatchNorm, ``eval fwd+bwd`` (frozen statistics, a fine-tune);
- float32, bfloat16, float16; 1 and 2 threads.

A cell whose input is above ``--max-mb`` (64 MB) is drawn again. The same ``--seed`` and the
same filters (``--ops``, ``--modes``, ``--dtypes``, ``--threads``, ``--max-mb``) draw the same
cells, in the same order; ``--cells N`` takes the first N of them. Each cell builds the torch.nn
module and its normlab.nn twin (same constructor arguments, same parameters) and times both on
the same tensors, interleaved (:func:`normlab.bench.timing.time_interleaved`, median after
warm-up; the first call timed apart). ``x_torch`` = torch's median / normlab's (>= 1: normlab
at least as fast).

Files in ``--out`` (default ``bench-results/``): ``sweep.csv`` and ``sweep.json`` (rewritten
after every cell: Ctrl-C keeps what was measured; ``--resume`` with the same seed and filters
skips the cells already there, and keeps rows of another draw beside the new ones) and
``sweep.png`` (the ratio against the input's size, a colour per family, a panel per layout and
thread count). The printed report: the worst ``--worst`` cells (15) and the geometric mean of
``x_torch`` per family, layout and thread count, and overall.

    normlab bench --suite sweep --quick                   # 24 cells, few repeats: ~1 min
    normlab bench --suite sweep                           # 300 cells, seed 0: ~5 min on 2 cores
    normlab bench --suite sweep --cells 100 --seed 3 --threads 2 --ops batch_norm,group_norm
    normlab bench --suite sweep --rerun-worst 10          # the 10 worst in --out again, 3x the repeats

``--rerun-worst K`` measures the K slowest cells already in ``--out`` again with three times the
repeats and keeps the first ratio beside the new one (``x_torch_first``): a cell that comes back
near 1.0 was noise, one that stays low is a real loss. From Python: ``run_sweep(cells=20,
out="/tmp/s")``; the report functions are in :mod:`normlab.bench.sweep_report`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
from collections.abc import Callable, Iterable, Mapping

import torch

from .cases import Candidate
from .chapters import _cell, build_modules as build_nn_pair, run_plan, timing_options
from .chapters_data import Case, choose, make_row, read_rows, row_key
from .run_context import DEFAULT_OUT, check_count, make_out, run_meta
from .sweep_report import print_result, render, summary, worst, write_csv, write_png  # noqa: F401

SUITE = "sweep"
CSV_NAME, JSON_NAME, PNG_NAME = "sweep.csv", "sweep.json", "sweep.png"
PROVIDERS = ("torch", "normlab")
FAMILIES = ("layer_norm", "rms_norm", "batch_norm", "group_norm", "instance_norm", "layer_norm2d")
ROW_FAMILIES = ("layer_norm", "rms_norm")
MODES = ("fwd", "fwd+bwd", "eval fwd", "eval fwd+bwd")
FAMILY_MODES = {f: MODES if f == "batch_norm" else MODES[:3] for f in FAMILIES}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
LAYOUTS = ("contiguous", "channels_last")
COMMON_CHANNELS = (1, 3, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
# (full run, --quick)
_DEFAULTS = {"cells": (300, 24), "threads": ((1, 2), (1, 2)), "repeats": (7, 3), "warmup": (1, 1),
             "min_sample_ms": (2.0, 1.0), "max_group_s": (4.0, 1.5)}
RERUN_FACTOR = 3  # --rerun-worst: this many times the repeats, the sample length and the time cap


@dataclasses.dataclass(frozen=True)
class SweepCase(Case):
    """A drawn cell's module and input (:class:`normlab.bench.chapters_data.Case`) and its family."""

    family: str = ""

    def spec(self) -> str:
        """The case as JSON (kept in each row, so ``--rerun-worst`` rebuilds it without the draw)."""
        return json.dumps({"family": self.family, "name": self.name, "args": list(self.args),
                           "shape": list(self.shape), "kwargs": [list(kv) for kv in self.kwargs],
                           "layout": self.layout})

    @classmethod
    def from_spec(cls, text: str) -> "SweepCase":
        d = json.loads(text)
        return cls(d["name"], tuple(d["args"]), tuple(d["shape"]), tuple(tuple(kv) for kv in d["kwargs"]),
                   d["layout"], d["family"])

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclasses.dataclass(frozen=True)
class Cell:
    """One measurement: a case in a dtype, mode and thread count; ``index`` is its place in the draw."""

    index: int
    case: SweepCase
    dtype: str
    mode: str
    threads: int

    @property
    def mbytes(self) -> float:
        return self.case.numel * DTYPES[self.dtype].itemsize / 2**20

    def key(self) -> tuple:
        return (self.case.label, self.case.shape_str, self.case.layout, self.dtype, str(self.threads), self.mode)


# --------------------------------------------------------------------------
# The draw
# --------------------------------------------------------------------------

def _log_int(rng: random.Random, lo: int, hi: int) -> int:
    return min(hi, max(lo, round(math.exp(rng.uniform(math.log(lo), math.log(hi))))))


def draw_case(rng: random.Random, family: str, layouts: tuple = LAYOUTS) -> SweepCase:
    """One case of ``family`` (its shape and constructor arguments), drawn from ``rng``."""
    if family in ROW_FAMILIES:
        rows, hidden = _log_int(rng, 1, 8192), _log_int(rng, 16, 16384)
        if hidden >= 64 and rng.random() < 0.5:
            hidden = 64 * round(hidden / 64)
        kwargs = (("bias", False),) if family == "layer_norm" and rng.random() < 0.2 else ()
        name = "LayerNorm" if family == "layer_norm" else "RMSNorm"
        return SweepCase(name, (hidden,), (rows, hidden), kwargs, "contiguous", family)
    n = _log_int(rng, 1, 64)
    c = rng.choice(COMMON_CHANNELS) if rng.random() < 0.6 else _log_int(rng, 1, 512)
    volume = family in ("batch_norm", "group_norm", "instance_norm") and rng.random() < 0.3
    if volume:
        side = _log_int(rng, 7, 256)
        spatial = (_log_int(rng, 2, 64), side, side)
    else:
        h = _log_int(rng, 7, 512)
        spatial = (h, h if rng.random() < 0.7 else _log_int(rng, 7, 512))
    layout = rng.choice(layouts)
    dim = "3d" if volume else "2d"
    if family == "batch_norm":
        name, args, kwargs = f"BatchNorm{dim}", (c,), ()
    elif family == "group_norm":
        groups = sorted({g for g in (1, 2, 4, 8, 16, 32) if c % g == 0} | {c})
        name, args, kwargs = "GroupNorm", (rng.choice(groups), c), ()
    elif family == "instance_norm":
        name, args, kwargs = f"InstanceNorm{dim}", (c,), (("affine", rng.random() < 0.5),)
    else:
        name, args, kwargs = "LayerNorm2d", (c,), ()
    return SweepCase(name, args, (n, c, *spatial), kwargs, layout, family)


def draw_cells(n: int, seed: int = 0, families: Iterable[str] = FAMILIES, modes: Iterable[str] = MODES,
               dtypes: Iterable[str] = tuple(DTYPES), threads: Iterable[int] = (1, 2),
               max_mb: float = 64.0, layouts: Iterable[str] = LAYOUTS) -> list[Cell]:
    """The first ``n`` cells of the draw for ``seed``: the same arguments give the same cells, and
    a smaller ``n`` gives a prefix of a larger one's. A cell whose input is above ``max_mb`` MiB,
    or one already drawn, is drawn again."""
    modes = tuple(modes)
    fams = [f for f in families if any(m in FAMILY_MODES[f] for m in modes)]
    if not fams:
        raise ValueError(f"normlab bench --suite sweep: no family runs the modes {list(modes)}; "
                         f"eval fwd+bwd is BatchNorm's only")
    dtypes, threads, layouts = tuple(dtypes), tuple(threads), tuple(layouts)
    rng, cells, seen = random.Random(seed), [], set()
    while len(cells) < n:
        family = rng.choice(fams)
        case = draw_case(rng, family, layouts)
        cell = Cell(len(cells), case, rng.choice(dtypes),
                    rng.choice([m for m in FAMILY_MODES[family] if m in modes]), rng.choice(threads))
        if cell.mbytes <= max_mb and cell.key() not in seen:
            seen.add(cell.key())
            cells.append(cell)
    return cells


# --------------------------------------------------------------------------
# What each provider runs
# --------------------------------------------------------------------------

def make_input(shape, dtype: torch.dtype, layout: str, gen: torch.Generator | None = None) -> torch.Tensor:
    """A standard-normal tensor in ``dtype``; ``layout="channels_last"`` is channels_last for 4-D,
    channels_last_3d for 5-D. With ``gen=None`` it is drawn in place, in ``dtype`` (no float32 copy)."""
    fmt = torch.contiguous_format
    if layout == "channels_last":
        fmt = torch.channels_last_3d if len(shape) == 5 else torch.channels_last
    if gen is None:
        return torch.empty(shape, dtype=dtype).contiguous(memory_format=fmt).normal_()
    return torch.randn(shape, generator=gen).to(dtype).contiguous(memory_format=fmt)


def build_pair(case: SweepCase, dtype: torch.dtype, gen: torch.Generator) -> dict[str, torch.nn.Module]:
    """``{"torch": module, "normlab": twin}``, same arguments and (seeded, perturbed) parameters;
    LayerNorm2d's torch side is ``permute + nn.LayerNorm + permute`` (it has no torch.nn class)."""
    from .blocks import build_modules as build_ln2d_pair

    return (build_ln2d_pair if case.name == "LayerNorm2d" else build_nn_pair)(case, dtype, gen)


def candidates(case: SweepCase, dtype: str, mode: str, seed: int = 0) -> dict[str, Candidate]:
    """``{provider: Candidate}`` for one cell, both on the same (seeded) tensors. ``fwd``: train
    mode, parameters requiring grad; ``eval fwd``: eval mode under no_grad; ``*fwd+bwd``: the
    forward on a leaf copy of ``x``, then ``y.backward(dy)``, the ``.grad``s set to None first."""
    dt = DTYPES[dtype]
    gen = torch.Generator().manual_seed(seed)
    x, dy = make_input(case.shape, dt, case.layout, gen), make_input(case.shape, dt, case.layout, gen)
    leaf = x.clone().requires_grad_(True)  # clone keeps the memory format
    eval_mode, backward = mode.startswith("eval"), mode.endswith("fwd+bwd")

    def candidate(m: torch.nn.Module) -> Candidate:
        params = tuple(m.parameters())

        def forward():
            return m(x)

        def step():
            for t in (leaf, *params):
                t.grad = None
            m(leaf).backward(dy)

        def prepare():  # three untimed calls, so the timer calibrates on a warm call
            m.train(not eval_mode)
            fn = step if backward else forward
            for _ in range(3):
                fn()
            return fn
        no_grad = eval_mode and not backward
        return Candidate(prepare, torch.no_grad if no_grad else _nullcontext)
    return {p: candidate(m) for p, m in build_pair(case, dt, gen).items()}


def _nullcontext():
    import contextlib
    return contextlib.nullcontext()


# --------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------

def sweep_row(cell: Cell, timed: Mapping, seed: int, previous: Mapping | None = None) -> dict:
    """A row: :func:`normlab.bench.chapters_data.make_row`'s fields and the cell's own (its place
    in the draw, family, size, the case as JSON, the 1-minute load average when it was written);
    after a rerun, the first ratio and the count."""
    row = make_row(cell.case, cell.dtype, cell.threads, cell.mode, timed)
    del row["data"]
    row.update(cell=cell.index, seed=seed, family=cell.case.family, numel=cell.case.numel,
               mbytes=round(cell.mbytes, 4), spec=cell.case.spec(), x_torch_first=None, reruns=0,
               load1=os.getloadavg()[0] if hasattr(os, "getloadavg") else None)  # above the cores: noisy
    if previous is not None:
        first = previous.get("x_torch_first")
        row.update(x_torch_first=previous.get("x_torch") if first is None else first,
                   reruns=int(previous.get("reruns") or 0) + 1, cell=previous.get("cell"),
                   seed=previous.get("seed"))
    return row


def cell_of(row: Mapping) -> Cell:
    return Cell(int(row["cell"]), SweepCase.from_spec(row["spec"]), row["dtype"], row["mode"], int(row["threads"]))


def _number(value, option: str, kind: Callable, least: float, meaning: str):
    try:
        v = kind(value)
    except (TypeError, ValueError):
        v = None
    if v is None or v < least or (kind is int and v != float(value)):
        raise ValueError(f"normlab bench --suite sweep: --{option}: expected {meaning}, got {value!r}")
    return v


def run_sweep(cells: int | None = None, seed: int = 0, ops=None, modes=None, dtypes=None, threads=None,
              max_mb: float = 64.0, out: str = DEFAULT_OUT, quick: bool = False, resume: bool = False,
              rerun_worst: int | None = None, worst_n: int = 15, repeats: int | None = None,
              warmup: int | None = None, min_sample_ms: float | None = None, max_group_s: float | None = None,
              progress: bool = True, on_group: Callable[[dict], None] | None = None) -> dict:
    """Draw the cells, measure those not yet in ``out`` and write ``sweep.csv``/``.json`` after every
    cell and ``sweep.png`` at the end. ``rerun_worst=K``: measure the K slowest ok cells already in
    ``out`` again instead (``RERUN_FACTOR`` times the repeats). Returns a JSON-serialisable dict:
    ``suite``, ``rows``, ``files``, ``measured``, ``skipped``, ``interrupted``, ``warnings``,
    ``summary``, ``worst_n``."""
    q = 1 if quick else 0
    n = _number(_DEFAULTS["cells"][q] if cells is None else cells, "cells", int, 1, "a whole number >= 1")
    seed = _number(seed, "seed", int, -2**63, "a whole number")
    max_mb = _number(max_mb, "max-mb", float, 1e-6, "a size in MiB > 0")
    worst_n = check_count(worst_n, "worst", 0, "cells listed in the worst-cell table")
    fams = choose(ops, FAMILIES, "family", {"row": ROW_FAMILIES}, SUITE) or list(FAMILIES)
    mode_list = choose(modes, MODES, "mode", None, SUITE) or list(MODES)
    dtype_list = choose(dtypes, list(DTYPES), "dtype", None, SUITE) or list(DTYPES)
    thread_list, repeats, warmup, min_sample_s, max_group_s = timing_options(
        _DEFAULTS, quick, threads, repeats, warmup, min_sample_ms, max_group_s)
    rows = read_rows(os.path.expanduser(str(out)), JSON_NAME) if resume or rerun_worst is not None else []
    previous: dict[tuple, dict] = {}
    if rerun_worst is not None:
        k = check_count(rerun_worst, "rerun-worst", 1, "the number of slowest cells to measure again")
        if not any(r["status"] == "ok" for r in rows):
            raise ValueError(f"normlab bench --suite sweep: --rerun-worst needs measured cells in "
                             f"{os.path.join(str(out), JSON_NAME)}; run the sweep into that --out first")
    out = make_out(out)
    files = {"csv": os.path.join(out, CSV_NAME), "json": os.path.join(out, JSON_NAME),
             "png": os.path.join(out, PNG_NAME)}
    if rerun_worst is not None:
        todo = [cell_of(r) for r in worst(rows, k)]
        previous = {row_key(r): r for r in rows}
        repeats, min_sample_s, max_group_s = (RERUN_FACTOR * repeats, RERUN_FACTOR * min_sample_s,
                                              RERUN_FACTOR * max_group_s)
        skipped = 0
    else:
        drawn = draw_cells(n, seed, fams, mode_list, dtype_list, thread_list, max_mb)
        have = {row_key(r) for r in rows}
        todo = [c for c in drawn if c.key() not in have]
        skipped = len(drawn) - len(todo)
    by_key = {c.key(): c for c in todo}
    plan = [(c.threads, c.case, c.dtype, [c.mode]) for c in todo]
    meta = run_meta({"suite": SUITE, "cells": n, "seed": seed, "families": fams, "modes": mode_list,
                     "dtypes": dtype_list, "threads": thread_list, "max_mb": max_mb, "quick": quick,
                     "rerun_worst": rerun_worst, "repeats": repeats, "warmup": warmup,
                     "min_sample_ms": min_sample_s * 1e3, "max_group_s": max_group_s})
    warnings: list[str] = []
    meta.update(suite=SUITE, warnings=warnings)

    def make(case, dtype, n_threads, mode, timed, _):
        key = (case.label, case.shape_str, case.layout, dtype, str(n_threads), mode)
        return sweep_row(by_key[key], timed, seed, previous.get(key))

    rows, measured, interrupted = run_plan(
        plan, suite=SUITE, out=out, rows=rows, files=files, meta=meta, warnings=warnings, progress=progress,
        on_group=on_group, providers=PROVIDERS, cell=_cell,
        timing=dict(repeats=repeats, warmup=warmup, min_sample_s=min_sample_s, max_total_s=max_group_s),
        build=lambda case, dtype, mode: (candidates(case, dtype, mode, seed), None),
        make=make, write_csv=write_csv)
    png = write_png(rows, files["png"])
    return {"suite": SUITE, "out": out, "files": dict(files, png=png), "rows": rows, "measured": measured,
            "skipped": skipped, "interrupted": interrupted, "warnings": warnings, "worst_n": worst_n,
            "rerun_worst": rerun_worst, "summary": summary(rows)}
