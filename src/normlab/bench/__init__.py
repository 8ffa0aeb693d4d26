"""``normlab bench``: normlab against torch eager, ``torch.compile`` and the copy limit.

For each op, shape, dtype, thread count and mode (forward, backward,
forward+backward), the providers (``normlab-cpu``, ``normlab-ref``, ``torch``,
``compile``, ``limit``) run in one process on the same tensors, interleaved,
after warm-up; the median of the repeats is reported with the achieved GB/s
(minimal bytes / time), the speed-up over torch eager and over ``torch.compile``
and the fraction of the copy limit. What each op must move at least, and why,
is the table in :mod:`normlab.bench.cases`.

Files in ``--out`` (default ``bench-results/``): ``bench.csv`` and
``bench.json`` (rewritten after every finished group, so Ctrl-C keeps what was
measured) and ``gbps_<dtype>_t<threads>.png``. ``--resume`` skips groups whose
rows are already there (n/a rows count as there).

    normlab bench --quick                      # < 1 min: one shape per op, float32, 1 thread
    normlab bench --ops layer_norm,add_rms_norm --dtypes bfloat16 --threads 2
    normlab bench --sizes 4x6,4096x1024 --providers torch,normlab-ref,limit
    python -m normlab.bench --quick            # the same without the top-level CLI
    normlab bench --suite chapters --quick     # module calls at the chapters' sizes (normlab.bench.chapters)

From Python (what the CLI and the tests call)::

    from normlab.bench import run_bench
    result = run_bench(ops=["layer_norm"], sizes=["4x6"], out="/tmp/b", repeats=3)

Timings on a shared or busy machine are noisy: compare providers within one
group (they saw the same load), not across runs.
"""

from __future__ import annotations

import gc
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable, Sequence

import torch

from . import cases as _cases
from .cases import MODES, OP_ALIASES, OPS, PROVIDERS, Case, cases_for, make_setup, parse_shape
from .report import (CSV_NAME, JSON_NAME, fmt_time, group_rows, make_table, merge_rows,
                     read_rows, render_table, row_key, write_csv, write_json, write_png)
from .timing import Timing, time_interleaved

__all__ = ["run_bench", "add_arguments", "add_bench_parser", "main_bench", "run", "render",
           "OPS", "MODES", "PROVIDERS"]

DEFAULT_OUT = "bench-results"
#: ``--suite``: "default" is this module's op benchmark; "chapters" is :mod:`normlab.bench.chapters`;
#: "blocks" is :mod:`normlab.bench.blocks`
SUITES = ("default", "chapters", "blocks")

# (full run, --quick)
_DEFAULTS = {
    "dtypes": (("float32", "bfloat16"), ("float32",)),
    "threads": ((1, 2), (1,)),
    "repeats": (11, 5),
    "warmup": (2, 1),
    "min_sample_ms": (2.0, 1.0),
    "max_group_s": (30.0, 3.0),
}


def _listify(value, what: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = value.split(",")
    items = [str(v).strip() for v in value if str(v).strip()]
    if not items:
        raise ValueError(f"normlab bench: expected at least one {what}, got {value!r}")
    return items


def _choose(value, allowed: Sequence[str], what: str, aliases=None) -> list[str] | None:
    items = _listify(value, what)
    if items is None:
        return None
    out = []
    for item in items:
        expanded = (aliases or {}).get(item, (item,))
        for name in expanded:
            if name not in allowed:
                names = list(allowed) + list(aliases or {})
                raise ValueError(f"normlab bench: unknown {what} {item!r}; expected one of {names}")
            if name not in out:
                out.append(name)
    return out


def _set_threads(n: int) -> None:
    torch.set_num_threads(n)
    numba = sys.modules.get("numba")
    if numba is not None:  # the "cpu" kernels' thread pool, when they are loaded
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))


def _get_threads() -> tuple[int, int | None]:
    numba = sys.modules.get("numba")
    return torch.get_num_threads(), (numba.get_num_threads() if numba is not None else None)


def _thread_guard(n: int, warnings: list[str], console) -> Callable[[str], None]:
    """After each call of ``provider``: if the thread count is no longer ``n``, warn once
    and set it back. (Seen: numba's "omp" threading layer shares torch's libgomp, and
    launching its pool on the first ``"cpu"`` kernel call set torch's count to
    NUMBA_NUM_THREADS; every torch op after it then ran with 2 threads.)"""
    def guard(provider: str) -> None:
        got = torch.get_num_threads()
        if got != n:
            msg = (f"{provider} changed torch.get_num_threads() from {n} to {got}; "
                   f"set back to {n} (it would leak into the providers timed after it)")
            if msg not in warnings:
                warnings.append(msg)
                if console is not None:
                    console.print(f"[yellow]warning: {msg}[/]")
            _set_threads(n)
    return guard


def progress_bar(show: bool):
    """The rich progress bar of a bench run, on stderr (hidden unless ``show``)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=Console(stderr=True), disable=not show)


def _meta(options: dict) -> dict:
    numba = sys.modules.get("numba")
    import normlab
    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "options": options,
        "normlab": normlab.__version__, "torch": torch.__version__,
        "numba": getattr(numba, "__version__", None), "python": platform.python_version(),
        "backends": normlab.available_backends(),
        "machine": platform.machine(), "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "loadavg_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def run_bench(
    ops: Iterable[str] | str | None = None,
    modes: Iterable[str] | str | None = None,
    dtypes: Iterable[str] | str | None = None,
    threads: Iterable[int] | str | None = None,
    providers: Iterable[str] | str | None = None,
    sizes: Iterable | str | None = None,
    out: str = DEFAULT_OUT,
    quick: bool = False,
    resume: bool = False,
    repeats: int | None = None,
    warmup: int | None = None,
    min_sample_ms: float | None = None,
    max_group_s: float | None = None,
    compile_backend: str = "inductor",
    progress: bool = True,
    on_group: Callable[[list[dict]], None] | None = None,
) -> dict:
    """Run the benchmark; write ``bench.csv``, ``bench.json`` and the PNGs into ``out``.

    Filters (``None`` = the default set): ``ops`` (``OPS`` or ``"batch_norm"`` for
    both BatchNorm modes), ``modes``, ``dtypes`` (``float32``, ``bfloat16``),
    ``threads``, ``providers``, ``sizes`` (shapes like ``"4096x1024"`` or tuples;
    they replace the default shapes: 2-D ones go to every op, 3-D and up to
    BatchNorm/GroupNorm). ``quick`` picks one shape per op family, float32, one
    thread and few repeats unless those are given. ``resume`` keeps the rows in
    ``out`` and skips groups already measured. ``compile_backend`` is passed to
    ``torch.compile`` (the tests use ``"aot_eager"`` to skip C++ compilation).
    ``on_group(rows)`` is called after each group is written.

    Ctrl-C (``KeyboardInterrupt``) stops after the files hold every finished
    group; the result then has ``interrupted=True``. Returns a JSON-serialisable
    dict: ``rows`` (all rows in ``out``), ``files``, ``measured``/``skipped``
    group counts and ``interrupted``.
    """
    q = 1 if quick else 0
    ops = _choose(ops, OPS, "op", OP_ALIASES) or list(OPS)
    modes = _choose(modes, MODES, "mode") or list(MODES)
    dtypes = _choose(dtypes, list(_cases.DTYPES), "dtype") or list(_DEFAULTS["dtypes"][q])
    providers = _choose(providers, PROVIDERS, "provider") or list(PROVIDERS)
    thread_list = [int(t) for t in (_listify(threads, "thread count") or _DEFAULTS["threads"][q])]
    if min(thread_list) < 1:
        raise ValueError(f"normlab bench: expected thread counts >= 1, got {thread_list}")
    shapes = None
    if sizes is not None:
        shapes = [parse_shape(s) if isinstance(s, str) else tuple(int(d) for d in s)
                  for s in (sizes.split(",") if isinstance(sizes, str) else sizes)]
    repeats = _DEFAULTS["repeats"][q] if repeats is None else int(repeats)
    warmup = _DEFAULTS["warmup"][q] if warmup is None else int(warmup)
    min_sample_s = 1e-3 * (_DEFAULTS["min_sample_ms"][q] if min_sample_ms is None else min_sample_ms)
    max_group_s = _DEFAULTS["max_group_s"][q] if max_group_s is None else float(max_group_s)

    options = {"ops": ops, "modes": modes, "dtypes": dtypes, "threads": thread_list,
               "providers": providers, "sizes": [list(s) for s in shapes] if shapes else None,
               "quick": quick, "repeats": repeats, "warmup": warmup,
               "min_sample_ms": min_sample_s * 1e3, "max_group_s": max_group_s,
               "compile_backend": compile_backend}
    os.makedirs(out, exist_ok=True)
    files = {"csv": os.path.join(out, CSV_NAME), "json": os.path.join(out, JSON_NAME), "png": []}
    rows = read_rows(out) if resume else []
    have = {row_key(r) for r in rows}

    # the plan: (threads, case, [modes still to measure])
    plan: list[tuple[int, Case, list[str]]] = []
    skipped = 0
    for n_threads in thread_list:
        for dtype in dtypes:
            for op in ops:
                for case in cases_for(op, dtype, shapes, quick):
                    todo = []
                    for mode in modes:
                        keys = {row_key({"op": case.op, "layout": case.layout,
                                         "shape": _cases.shape_str(case.shape), "dtype": case.dtype,
                                         "threads": n_threads, "mode": mode, "provider": p})
                                for p in providers}
                        if keys <= have:
                            skipped += 1
                        else:
                            todo.append(mode)
                    if todo:
                        plan.append((n_threads, case, todo))

    meta = _meta(options)
    warnings: list[str] = []
    meta["warnings"] = warnings
    measured = 0
    interrupted = False
    saved_threads = _get_threads()
    bar = progress_bar(progress)
    console = bar.console
    try:
        with bar:
            task = bar.add_task("normlab bench", total=sum(len(m) for _, _, m in plan))
            current_threads = None
            for n_threads, case, todo in plan:
                if n_threads != current_threads:
                    _set_threads(n_threads)
                    current_threads = n_threads
                    guard = _thread_guard(n_threads, warnings, bar.console if progress else None)
                if "compile" in providers:
                    torch._dynamo.reset()  # compile once per case; no recompile limit across cases
                bar.update(task, description=f"{case.label()} t{n_threads}: setup")
                setup = make_setup(case, providers, compile_backend)
                for mode in todo:
                    bar.update(task, description=f"{case.label()} t{n_threads} {mode}")
                    cands = {p: setup.candidate(p, mode) for p in providers if p not in setup.unavailable}
                    timed = time_interleaved(cands, repeats=repeats, warmup=warmup,
                                             min_sample_s=min_sample_s, max_total_s=max_group_s,
                                             after_call=guard)
                    timings = {p: timed.get(p) or Timing(status="n/a", reason=setup.unavailable[p])
                               for p in providers}
                    new = group_rows(case, n_threads, mode, setup.min_bytes(mode), timings)
                    del cands, timed
                    rows = merge_rows(rows, new)
                    meta["loadavg_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
                    write_csv(rows, files["csv"])
                    write_json(rows, meta, files["json"])
                    measured += 1
                    if progress:
                        bar.console.print(_summary(case, n_threads, mode, new), highlight=False)
                    bar.advance(task)
                    if on_group is not None:
                        on_group(new)
                del setup
                gc.collect()
    except KeyboardInterrupt:
        interrupted = True
        console.print(f"[yellow]interrupted: {measured} groups measured in this run are kept in {out}[/]")
    finally:
        torch.set_num_threads(saved_threads[0])
        if saved_threads[1] is not None and "numba" in sys.modules:
            sys.modules["numba"].set_num_threads(saved_threads[1])
    if not os.path.exists(files["json"]):  # nothing to measure: still leave valid files
        write_csv(rows, files["csv"])
        write_json(rows, meta, files["json"])
    files["png"] = write_png(rows, out)
    return {"out": out, "files": files, "rows": rows, "measured": measured,
            "skipped": skipped, "interrupted": interrupted, "warnings": warnings}


def _summary(case: Case, threads: int, mode: str, rows: list[dict]) -> str:
    parts = []
    for r in rows:
        cell = fmt_time(r["median_s"]) if r["status"] == "ok" else r["status"]
        parts.append(f"{r['provider']} {cell}")
    return f"  {case.label()} t{threads} {mode}: " + ", ".join(parts)


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

HELP = "time normlab against torch eager, torch.compile and the memory-copy limit"


def add_arguments(parser) -> None:
    """The options of ``normlab bench`` (the ``normlab.cli`` convention)."""
    parser.add_argument("--suite", default="default", choices=SUITES,
                        help="default: ops against torch eager, torch.compile and the copy limit; "
                             "chapters: normlab.nn module calls against torch.nn's at the chapters' "
                             "sizes, and the chapter's training loop (normlab.bench.chapters); "
                             "blocks: a Llama decoder block with and without normlab.convert, and "
                             "LayerNorm2d vs permute+LayerNorm (normlab.bench.blocks)")
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                        help=f"directory for bench.csv, bench.json and the PNGs; chapters.csv, chapters.json with "
                             f"--suite chapters (default {DEFAULT_OUT}/)")
    parser.add_argument("--quick", action="store_true",
                        help="under a minute: one shape per op family, float32, 1 thread, few repeats")
    parser.add_argument("--resume", action="store_true",
                        help="keep the rows in --out and skip groups already measured")
    parser.add_argument("--ops", metavar="LIST", help=f"comma-separated, from {', '.join(OPS)}, batch_norm "
                        "(--suite chapters: layer names such as batchnorm1d,layernorm,add_rms_norm,loop)")
    parser.add_argument("--modes", metavar="LIST", help=f"comma-separated, from {', '.join(MODES)} "
                        "(--suite chapters: fwd, fwd+bwd, eval fwd)")
    parser.add_argument("--dtypes", metavar="LIST", help="comma-separated, from float32, bfloat16")
    parser.add_argument("--threads", metavar="LIST", help="comma-separated thread counts (default 1,2)")
    parser.add_argument("--providers", metavar="LIST", help=f"comma-separated, from {', '.join(PROVIDERS)}")
    parser.add_argument("--sizes", metavar="LIST",
                        help="comma-separated shapes replacing the defaults, e.g. 4x6,4096x1024,32x64x32x32 "
                             "(2-D: every op; 3-D and up: batch_norm/group_norm)")
    parser.add_argument("--repeats", type=int, metavar="N", help="timed repeats per group (default 11; quick 5)")
    parser.add_argument("--warmup", type=int, metavar="N", help="warm-up samples per provider (default 2; quick 1)")
    parser.add_argument("--compile-backend", default="inductor", metavar="NAME",
                        help="torch.compile backend of the 'compile' provider (default inductor)")


_OPTION_NAMES = ("suite", "out", "quick", "resume", "ops", "modes", "dtypes", "threads", "providers",
                 "sizes", "repeats", "warmup", "compile_backend")


# --suite chapters: the options it takes (--ops names its layers); the rest must be unset
_CHAPTERS_OPTIONS = ("out", "quick", "resume", "modes", "dtypes", "threads", "repeats", "warmup")


def _run_chapters(options: dict, suite: str = "chapters") -> dict:
    from .blocks import run_blocks
    from .chapters import run_chapters

    for name in ("sizes", "providers"):
        if options.get(name) is not None:
            raise ValueError(f"normlab bench --suite {suite}: --{name} is not used by this suite "
                             "(its shapes and providers are fixed: torch.nn vs normlab.nn)")
    opts = {k: options[k] for k in _CHAPTERS_OPTIONS if options.get(k) is not None}
    return (run_blocks if suite == "blocks" else run_chapters)(layers=options.get("ops"), **opts)


def run(**options) -> dict:
    """``normlab.cli`` convention: run with the parsed options, return the result dict."""
    suite = options.pop("suite", None) or "default"
    if suite not in SUITES:
        raise ValueError(f"normlab bench: unknown suite {suite!r}; expected one of {list(SUITES)}")
    if suite in ("chapters", "blocks"):
        return _run_chapters(options, suite)
    return run_bench(**{k: v for k, v in options.items() if k in _OPTION_NAMES})


def _footer(result: dict) -> list[str]:
    files = result["files"]
    lines = [f"warning: {w}" for w in result.get("warnings", [])]
    lines.append(f"files: {', '.join([files['csv'], files['json'], *files['png']])}")
    if result["interrupted"]:
        lines.append("interrupted: the files hold every group finished before Ctrl-C; "
                     "continue with --resume")
    return lines


def render(result: dict) -> str:
    """``normlab.cli`` convention: the result as text (table, then the files written)."""
    if result.get("suite") == "blocks":
        from .blocks import render as render_blocks
        return render_blocks(result)
    if result.get("suite") == "chapters":
        from .chapters import render as render_chapters
        return render_chapters(result)
    return "\n".join([render_table(result["rows"]), *_footer(result)])


def add_bench_parser(subparsers):
    """Add ``bench`` to an argparse ``subparsers``; ``args.func(args)`` runs it."""
    p = subparsers.add_parser("bench", help=HELP, description=HELP)
    add_arguments(p)
    p.set_defaults(func=main_bench)
    return p


def main_bench(args) -> int:
    """Run ``normlab bench`` from parsed ``args``; prints the table; returns the exit status
    (130 after Ctrl-C, as a shell reports an interrupted command)."""
    from rich.console import Console

    result = run(**{k: getattr(args, k) for k in _OPTION_NAMES if hasattr(args, k)})
    if result.get("suite") in ("chapters", "blocks"):
        from importlib import import_module
        import_module(f".{result['suite']}", __name__).print_result(result)
        return 130 if result["interrupted"] else 0
    console = Console()
    if not console.is_terminal:  # a file or pipe: do not squeeze the table into 80 columns
        console = Console(width=180)
    console.print(make_table(result["rows"]))
    for line in _footer(result):
        console.print(line, highlight=False)
    return 130 if result["interrupted"] else 0
