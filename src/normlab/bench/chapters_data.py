"""The chapters suite's data (``normlab bench --suite chapters``): its cases, and its rows,
files and tables. What each provider runs and the run itself are in :mod:`normlab.bench.chapters`;
:mod:`normlab.bench.blocks` reuses the rows, files and tables."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
from collections.abc import Callable, Mapping, Sequence

from .cases import DTYPES
from .run_context import listify
from .report import _atomic_write, ratio_and_times
from .timing import Timing

SUITE = "chapters"
CSV_NAME = "chapters.csv"
JSON_NAME = "chapters.json"
PROVIDERS = ("torch", "normlab")
MODES = ("fwd", "fwd+bwd", "eval fwd")
MODE_ALIASES = {"forward": ("fwd",), "forward+backward": ("fwd+bwd",), "eval": ("eval fwd",)}
LOOP_MODE = "train 30 steps"
EPS, RMS_EPS = 1e-5, 1e-6  # the fused adds: explicit eps for both providers

# (full run, --quick)
_DEFAULTS = {"dtypes": (("float32", "bfloat16"), ("float32",)), "threads": ((1, 2), (1,)),
             "repeats": (21, 5), "warmup": (2, 1), "min_sample_ms": (3.0, 1.0),
             "max_group_s": (20.0, 3.0)}

FIELDS = ("layer", "name", "shape", "layout", "dtype", "threads", "mode", "status", "reason",
          "torch_us", "normlab_us", "x_torch", "torch_min_us", "normlab_min_us", "repeats",
          "torch_inner", "normlab_inner", "torch_first_call_s", "normlab_first_call_s",
          "torch_runs_per_s", "normlab_runs_per_s", "data")
KEY_FIELDS = ("layer", "shape", "layout", "dtype", "threads", "mode")


@dataclasses.dataclass(frozen=True)
class Case:
    """A ``torch.nn``/``normlab.nn`` class ``name`` built with ``args``/``kwargs`` and called
    on an input of ``shape`` in ``layout``; or a fused add (``add_*``); or a loop (``loop_*``,
    ``args=(norm,)``, ``shape`` the data's)."""

    name: str
    args: tuple
    shape: tuple
    kwargs: tuple = ()
    layout: str = "contiguous"

    @property
    def label(self) -> str:
        if self.name.startswith("loop_"):
            return f"MLP[2,64,64,64,2]+{self.args[0]}(64)"
        return f"{self.name}({', '.join([*map(str, self.args), *(f'{k}={v}' for k, v in self.kwargs)])})"

    @property
    def shape_str(self) -> str:
        return "x".join(map(str, self.shape))

    def what(self, dtype: str, threads: int, mode: str) -> str:
        lay = " channels_last" if self.layout == "channels_last" else ""
        return f"{self.label} {self.shape_str}{lay} {dtype} t{threads} {mode}"


_AFF = (("affine", True),)
CASES = (
    Case("BatchNorm1d", (3,), (4, 3)),
    Case("BatchNorm1d", (64,), (300, 64)),
    Case("BatchNorm2d", (16,), (8, 16, 16, 16)),
    Case("BatchNorm2d", (16,), (8, 16, 16, 16), layout="channels_last"),
    Case("BatchNorm3d", (8,), (4, 8, 4, 8, 8)),
    Case("LayerNorm", (6,), (4, 6)),
    Case("LayerNorm", (512,), (32, 10, 512)),
    Case("RMSNorm", (6,), (4, 6)),
    Case("RMSNorm", (512,), (32, 10, 512)),
    Case("GroupNorm", (8, 32), (8, 32, 16, 16)),
    Case("InstanceNorm1d", (64,), (8, 64, 32), _AFF),
    Case("InstanceNorm2d", (16,), (8, 16, 16, 16), _AFF),
    Case("add_layer_norm", (6,), (4, 6)),
    Case("add_layer_norm", (512,), (32, 10, 512)),
    Case("add_rms_norm", (6,), (4, 6)),
    Case("add_rms_norm", (512,), (32, 10, 512)),
)
LOOPS = (Case("loop_batchnorm1d", ("BatchNorm1d",), (300, 2)),
         Case("loop_layernorm", ("LayerNorm",), (300, 2)))
LAYERS = tuple(dict.fromkeys(c.name for c in CASES + LOOPS))
LAYER_ALIASES = {"loop": tuple(c.name for c in LOOPS)}


def choose(value, allowed: Sequence[str], what: str,
            aliases: Mapping[str, Sequence[str]] | None = None, suite: str = "chapters") -> list[str] | None:
    """The names in ``value`` (a comma-separated string or a list), matched in any case."""
    items = listify(value, what)
    if items is None:
        return None
    aliases = aliases or {}
    by_lower = {n.lower(): (n,) for n in allowed} | {k.lower(): tuple(v) for k, v in aliases.items()}
    out = []
    for item in items:
        if item.lower() not in by_lower:
            raise ValueError(f"normlab bench --suite {suite}: unknown {what} {item!r}; "
                             f"expected one of {list(allowed) + list(aliases)}")
        out += [n for n in by_lower[item.lower()] if n not in out]
    return out


# --------------------------------------------------------------------------
# Rows and files
# --------------------------------------------------------------------------

def row_key(row: Mapping) -> tuple:
    return tuple(str(row[f]) for f in KEY_FIELDS)


def make_row(case: Case, dtype: str, threads: int, mode: str, timings: Mapping[str, Timing],
             data: str = "") -> dict:
    """One row: both providers' times (µs); ``x_torch`` = torch time / normlab time."""
    t, n = timings["torch"], timings["normlab"]
    bad = [(p, tm) for p, tm in timings.items() if tm.status != "ok"]
    ok, loop = not bad, case.name.startswith("loop_")
    row = {"layer": case.label, "name": case.name, "shape": case.shape_str, "layout": case.layout,
           "dtype": dtype, "threads": threads, "mode": mode, "status": bad[0][1].status if bad else "ok",
           "reason": "; ".join(f"{p}: {tm.reason}" for p, tm in bad),
           "x_torch": t.median_s / n.median_s if ok else None,
           "repeats": min(len(tm.samples) for tm in timings.values()), "data": data if loop else ""}
    for p, tm in timings.items():  # a provider's own times are kept when the other one failed
        mine = tm.status == "ok"
        row.update({f"{p}_us": tm.median_s * 1e6 if mine else None,
                    f"{p}_min_us": tm.min_s * 1e6 if mine else None, f"{p}_inner": tm.inner,
                    f"{p}_first_call_s": tm.first_call_s,
                    f"{p}_runs_per_s": 1.0 / tm.median_s if ok and loop else None})
    return row


def write_csv(rows: Sequence[dict], path: str, fields: Sequence[str] = FIELDS) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore")
    w.writeheader()
    w.writerows({k: ("" if r.get(k) is None else r.get(k)) for k in fields} for r in rows)
    _atomic_write(path, buf.getvalue())


def read_rows(out_dir: str, name: str = JSON_NAME) -> list[dict]:
    """Rows already in ``out_dir/<name>`` (``chapters.json``; ``--resume``); none if absent or damaged."""
    try:
        with open(os.path.join(out_dir, name)) as f:
            return list(json.load(f)["rows"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------

_ORDER = {(c.label, c.shape_str, c.layout): i for i, c in enumerate(CASES + LOOPS)}


def _sort_key(r: Mapping):
    index = (lambda seq, v: seq.index(v) if v in seq else len(seq))
    return (_ORDER.get((r["layer"], r["shape"], r["layout"]), len(_ORDER)), index(list(DTYPES), r["dtype"]),
            int(r["threads"]), index(MODES, r["mode"]))


def summary(rows: Sequence[Mapping]) -> str:
    """The verdict in one line: rows >= 1.0x, the slowest module call, the loops' ratios."""
    ok = sorted((r for r in rows if r["status"] == "ok"), key=_sort_key)
    failed = f"; {len(rows) - len(ok)} rows failed" if len(ok) < len(rows) else ""
    text = f"chapters: {sum(r['x_torch'] >= 1.0 for r in ok)} of {len(ok)} rows >= 1.0x"
    calls = [r for r in ok if r["mode"] != LOOP_MODE]
    if calls:
        slow = min(calls, key=lambda r: r["x_torch"])
        lay = " channels_last" if slow["layout"] == "channels_last" else ""
        text += (f"; slowest module call {slow['x_torch']:.2f}x ({slow['layer']} {slow['shape']}{lay} "
                 f"{slow['dtype']} t{slow['threads']} {slow['mode']})")
    loops = [f"{r['layer'].split('+')[1]} t{r['threads']} {r['x_torch']:.2f}x" for r in ok if r["mode"] == LOOP_MODE]
    return text + ("; training loop " + ", ".join(loops) if loops else "") + failed


def _table(title: str, columns: str, caption: str | None = None):
    from rich.table import Table

    table = Table(title=title, caption=caption, caption_justify="left", pad_edge=False)
    for name in columns.split("|"):
        table.add_column(name, no_wrap=True, justify="left" if name in ("layer", "model", "shape", "dtype", "mode")
                         else "right")
    return table


def make_tables(rows: Sequence[Mapping]) -> list:
    """``rich`` tables: the module calls (a section per layer and shape), then the loops."""
    calls = _table("normlab bench --suite chapters: module calls",
                   "layer|shape|dtype|thr|mode|torch|normlab|×torch",
                   "time: median per call; ×torch = torch time / normlab time (>= 1: normlab at least as "
                   "fast); add_*: normlab.functional.add_*_norm vs x + r then torch.nn.functional.*_norm")
    loops = _table("the chapter's training loop: a run = 30 full-batch SGD steps on 300 points",
                   "model|dtype|thr|torch|normlab|torch runs/s|normlab runs/s|×torch")
    last, data = None, set()
    for r in sorted(rows, key=_sort_key):
        ok = r["status"] == "ok"
        ratio, times = ratio_and_times(r)
        if r["mode"] == LOOP_MODE:
            data.add(r.get("data") or "")
            per_s = [f"{r['torch_runs_per_s']:.1f}", f"{r['normlab_runs_per_s']:.1f}"] if ok else ["", ""]
            loops.add_row(r["layer"], r["dtype"], str(r["threads"]), *times, *per_s, ratio)
            continue
        group = (r["layer"], r["shape"], r["layout"])
        if last is not None and group != last:
            calls.add_section()
        head = ["", ""] if group == last else [r["layer"], r["shape"] + (" cl" if r["layout"] == "channels_last" else "")]
        last = group
        calls.add_row(*head, r["dtype"], str(r["threads"]), r["mode"], *times, ratio)
    loops.caption = "data: " + ", ".join(sorted(d for d in data if d)) if data - {""} else None
    return [t for t in (calls, loops) if t.row_count]


def _footer(result: Mapping) -> list[str]:
    lines = [f"warning: {w}" for w in result.get("warnings", [])]
    lines += [result["summary"], f"files: {result['files']['csv']}, {result['files']['json']}"]
    if result["interrupted"]:
        lines.append("interrupted: the files hold every row finished before Ctrl-C; continue with --resume")
    return lines


def render(result: Mapping, width: int = 140, tables: Callable = None) -> str:
    """The result as plain text: the tables (``tables(rows)``, this suite's by default), the
    summary line, the files."""
    from rich.console import Console

    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=False, color_system=None)
    for table in (tables or make_tables)(result["rows"]):
        con.print(table)
    return buf.getvalue().rstrip("\n") + "\n" + "\n".join(_footer(result))


def print_result(result: Mapping, console=None, tables: Callable = None) -> None:
    """The result on a rich console (colours on a terminal); ``tables`` as in :func:`render`."""
    from rich.console import Console

    console = console or (Console() if Console().is_terminal else Console(width=140))
    for table in (tables or make_tables)(result["rows"]):
        console.print(table)
    for line in _footer(result):
        console.print(line, highlight=False, soft_wrap=True)
