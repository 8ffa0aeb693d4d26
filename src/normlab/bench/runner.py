"""The default suite of ``normlab bench``: each op against torch eager, ``torch.compile`` and the
copy limit (:func:`run_bench`; the CLI is in ``normlab.bench``)."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterable

import torch

from . import cases as _cases
from .cases import MODES, OP_ALIASES, OPS, PROVIDERS, Case, cases_for, parse_shape
from .setups import make_setup
from .run_context import (DEFAULT_OUT, REPEATS_MEANING, WARMUP_MEANING, check_count, choose, get_threads, listify,
                          make_out, run_meta, set_threads, thread_guard, progress_bar)
from .report import (CSV_NAME, JSON_NAME, fmt_time, group_rows, merge_rows, read_rows, row_key, write_csv,
                     write_json, write_png)
from .timing import Timing, time_interleaved

# (full run, --quick)
_DEFAULTS = {
    "dtypes": (("float32", "bfloat16"), ("float32",)),
    "threads": ((1, 2), (1,)),
    "repeats": (11, 5),
    "warmup": (2, 1),
    "min_sample_ms": (2.0, 1.0),
    "max_group_s": (30.0, 3.0),
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
    ops = choose(ops, OPS, "op", OP_ALIASES) or list(OPS)
    modes = choose(modes, MODES, "mode") or list(MODES)
    dtypes = choose(dtypes, list(_cases.DTYPES), "dtype") or list(_DEFAULTS["dtypes"][q])
    providers = choose(providers, PROVIDERS, "provider") or list(PROVIDERS)
    thread_list = [int(t) for t in (listify(threads, "thread count") or _DEFAULTS["threads"][q])]
    if min(thread_list) < 1:
        raise ValueError(f"normlab bench: expected thread counts >= 1, got {thread_list}")
    shapes = None
    if sizes is not None:
        shapes = [parse_shape(s) if isinstance(s, str) else tuple(int(d) for d in s)
                  for s in (sizes.split(",") if isinstance(sizes, str) else sizes)]
    repeats = check_count(_DEFAULTS["repeats"][q] if repeats is None else repeats, "repeats", 1, REPEATS_MEANING)
    warmup = check_count(_DEFAULTS["warmup"][q] if warmup is None else warmup, "warmup", 0, WARMUP_MEANING)
    min_sample_s = 1e-3 * (_DEFAULTS["min_sample_ms"][q] if min_sample_ms is None else min_sample_ms)
    max_group_s = _DEFAULTS["max_group_s"][q] if max_group_s is None else float(max_group_s)

    if "compile" in providers:
        check_compile_backend(compile_backend)

    options = {"ops": ops, "modes": modes, "dtypes": dtypes, "threads": thread_list,
               "providers": providers, "sizes": [list(s) for s in shapes] if shapes else None,
               "quick": quick, "repeats": repeats, "warmup": warmup,
               "min_sample_ms": min_sample_s * 1e3, "max_group_s": max_group_s,
               "compile_backend": compile_backend}
    out = make_out(out)
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

    meta = run_meta(options)
    warnings: list[str] = []
    meta["warnings"] = warnings
    measured = 0
    interrupted = False
    saved_threads = get_threads()
    bar = progress_bar(progress)
    console = bar.console
    try:
        with bar:
            task = bar.add_task("normlab bench", total=sum(len(m) for _, _, m in plan))
            current_threads = None
            for n_threads, case, todo in plan:
                if n_threads != current_threads:
                    set_threads(n_threads)
                    current_threads = n_threads
                    guard = thread_guard(n_threads, warnings, bar.console if progress else None)
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
        torch.set_num_threads(saved_threads)
    if not os.path.exists(files["json"]):  # nothing to measure: still leave valid files
        write_csv(rows, files["csv"])
        write_json(rows, meta, files["json"])
    try:
        files["png"] = write_png(rows, out)
    except KeyboardInterrupt:  # Ctrl-C while drawing: the CSV and JSON are complete already
        interrupted = True
        console.print(f"[yellow]interrupted while drawing the plots: {CSV_NAME} and {JSON_NAME} in {out} hold every "
                      "measured group; --resume draws the plots again without measuring[/]")
    return {"out": out, "files": files, "rows": rows, "measured": measured,
            "skipped": skipped, "interrupted": interrupted, "warnings": warnings}


def check_compile_backend(name: str) -> str:
    """``--compile-backend``: a name torch.compile knows, checked before any work."""
    from torch import _dynamo

    if not isinstance(name, str) or name not in _dynamo.list_backends(exclude_tags=()):
        raise ValueError(f"normlab bench: unknown --compile-backend {name!r}; expected one torch.compile knows: "
                         f"{', '.join(_dynamo.list_backends())} (or a debug one such as aot_eager, eager)")
    return name


def _summary(case: Case, threads: int, mode: str, rows: list[dict]) -> str:
    parts = []
    for r in rows:
        cell = fmt_time(r["median_s"]) if r["status"] == "ok" else r["status"]
        parts.append(f"{r['provider']} {cell}")
    return f"  {case.label()} t{threads} {mode}: " + ", ".join(parts)
