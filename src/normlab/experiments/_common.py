"""What every experiment shares: argument checks, the sweep runner, summaries.

Argument checks raise ``ValueError`` with what was expected, what was given and the fix;
the ``arg_*`` wrappers turn them into argparse errors, so the command line reports bad
input in one line before any run starts.

The sweep runner takes tasks -- ``(function, kwargs, n_runs)`` with a module-level
``function(**kwargs) -> [record, ...]`` -- and runs them here, in a pool of
processes (``workers``) or on a Ray cluster (``executor="ray"``). Only this process,
the driver, writes the store: one transaction per record, as each task finishes.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import time
from typing import Any, Callable, Iterable, Sequence

from .store import DEFAULT_STORE, StoreError, check_path

EXECUTORS = ("local", "ray")


# --------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------

def _items(value: str | Iterable, what: str, example: str) -> list:
    items = [s.strip() for s in value.split(",")] if isinstance(value, str) else list(value)
    if not items or any(s == "" for s in items):
        raise ValueError(f"{what}: expected a comma-separated list such as {example}, got {value!r}")
    return items


def parse_norms(value: str | Iterable[str], known: Sequence[str]) -> list[str]:
    """Norm names, each one of ``known``, no repeats."""
    names = _items(value, "norms", ",".join(known))
    for n in names:
        if n not in known:
            raise ValueError(f"norms: unknown norm {n!r}; known norms are {', '.join(known)}")
    if len(set(names)) != len(names):
        raise ValueError(f"norms: expected each norm once, got {','.join(names)}")
    return names


def _ascending(values: list, text: str, what: str) -> None:
    if any(b <= a for a, b in zip(values, values[1:])):
        fixed = ",".join(f"{v:g}" for v in sorted(set(values)))
        raise ValueError(f"{what}: expected values in ascending order without repeats, got {text}; "
                         f"write them as {fixed}")


def parse_lrs(value: str | Iterable) -> list[float]:
    """Learning rates: numbers > 0, ascending."""
    items = _items(value, "learning rates", "0.1,0.3,1,2,4")
    out = []
    for s in items:
        try:
            lr = float(s)
        except (TypeError, ValueError):
            raise ValueError(f"learning rates: expected numbers such as 0.1,2, got {s!r}") from None
        if not math.isfinite(lr):
            raise ValueError(f"learning rates: expected finite numbers, got {s} (it reads as {lr}); "
                             f"use values such as 0.1,2")
        if lr <= 0:
            raise ValueError(f"learning rates: expected each > 0, got {s}; SGD with lr <= 0 does not train")
        out.append(lr)
    _ascending(out, ",".join(map(str, items)), "learning rates")
    return out


def parse_batch_sizes(value: str | Iterable, n_train: int) -> list[int]:
    """Batch sizes: integers in 1..n_train, ascending."""
    items = _items(value, "batch sizes", "2,4,8,16")
    out = []
    for s in items:
        try:
            b = int(s)
            if isinstance(s, float) and s != b:
                raise ValueError
        except (TypeError, ValueError):
            raise ValueError(f"batch sizes: expected whole numbers such as 2,8,32, got {s!r}") from None
        if b < 1 or b > n_train:
            raise ValueError(f"batch sizes: expected each between 1 and the training set's size "
                             f"{n_train}, got {b}")
        out.append(b)
    _ascending(out, ",".join(map(str, items)), "batch sizes")
    return out


def parse_count(value, what: str, lo: int = 1, hi: int | None = None, hint: str = "") -> int:
    try:
        n = int(value)
        if isinstance(value, float) and value != n:
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError(f"{what}: expected a whole number, got {value!r}") from None
    if n < lo or (hi is not None and n > hi):
        rng = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise ValueError(f"{what}: expected {rng}, got {n}{hint}")
    return n


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (macOS, Windows)
        return os.cpu_count() or 1


def parse_workers(value, threads: int = 1) -> int | str:
    """A worker count, or ``"auto"`` (resolved by :func:`check_parallel` once threads are known)."""
    if value == "auto":
        return value
    c = cores()
    return parse_count(value, "workers", 1, max(1, c // threads),
                       f" (this machine has {plural(c, 'core')} and each worker takes"
                       f" {plural(threads, 'torch thread')}:"
                       f" workers x threads <= cores)")


def parse_threads(value) -> int:
    c = cores()
    return parse_count(value, "threads", 1, c, f" (this machine has {plural(c, 'core')})")


def parse_executor(value: str) -> str:
    if value not in EXECUTORS:
        raise ValueError(f"executor: expected one of {', '.join(EXECUTORS)}, got {value!r}")
    if value == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ValueError("executor ray: Ray is not installed; pip install 'normlab[ray]'"
                             " (or pip install 'ray>=2.9'), or use --executor local") from None
    return value


def arg(check: Callable) -> Callable:
    """An argparse ``type=``: ``check(text)``, its ValueError/StoreError as an argparse error."""
    def wrapped(text):
        try:
            return check(text)
        except (ValueError, StoreError) as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    wrapped.__name__ = check.__name__
    return wrapped


def arg_store(text: str) -> str:
    """argparse type: a usable store path (checked, nothing created)."""
    return str(arg(check_path)(text))


class _Parallel(argparse.Action):
    """Stores --workers/--threads and checks workers x threads <= cores as soon as both are known."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        w, t = getattr(namespace, "workers", 1), getattr(namespace, "threads", 1)
        if w != "auto" and w * t > cores():
            parser.error(f"--workers {w} x --threads {t} = {w * t} exceeds this machine's {plural(cores(), 'core')}; "
                         f"lower one of them")


def add_common_arguments(p: argparse.ArgumentParser) -> None:
    """``--store``, ``--workers``, ``--executor``, ``--ray-address``, ``--quick``."""
    p.add_argument("--store", type=arg_store, default=DEFAULT_STORE,
                   help=f"SQLite results store (default {DEFAULT_STORE}); stored runs are skipped")
    p.add_argument("--workers", type=arg(parse_workers), default="auto", action=_Parallel,
                   help="run in N processes at once (default auto: cores // threads); workers x threads <= cores")
    p.add_argument("--threads", type=arg(parse_threads), default=1, action=_Parallel,
                   help="torch threads per process (default 1: these models are small; on a busy"
                        " machine a second thread made their steps more than 20x slower)")
    p.add_argument("--executor", type=arg(parse_executor), default="local",
                   help="local (this machine) or ray (a Ray cluster; pip install 'normlab[ray]')")
    p.add_argument("--ray-address", default=None,
                   help="Ray cluster address for --executor ray (default: start a local Ray instance)")
    p.add_argument("--quick", action="store_true", help="a small sweep (CI, README): stability --quick takes ~9 s on 2 cores")




# --------------------------------------------------------------------------
# The sweep runner
# --------------------------------------------------------------------------

def show_progress() -> bool:
    """A bar only for a person at a terminal: not in CI logs, pipes or files."""
    return sys.stdout.isatty() and sys.stderr.isatty()


def progress_bar(show: bool | None = None):
    """A rich progress bar over runs, with an ETA, on stderr."""
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)
    show = show_progress() if show is None else show
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), console=Console(stderr=True), disable=not show)


def _init_worker(threads: int, parent: int | None = None) -> None:
    import torch
    torch.set_num_threads(threads)
    if parent is not None:
        _die_with(parent)


def _die_with(parent: int) -> None:
    """End this worker when its parent ``parent`` ends (a ``kill -9`` of the sweep leaves no
    worker training on for nobody): Linux's parent-death signal, else a watching thread."""
    import signal
    import threading
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, signal.SIGKILL, 0, 0, 0) == 0:  # PR_SET_PDEATHSIG
            if os.getppid() != parent:                 # the parent ended before prctl
                os._exit(1)
            return
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="normlab-parent-watch", daemon=True).start()


def _call(fn: Callable, kwargs: dict, threads: int | None = None) -> list[dict]:
    if threads is not None:
        _init_worker(threads)
    return fn(**kwargs)


def check_parallel(workers, threads, executor) -> tuple[int, int, str]:
    """Checked ``(workers, threads, executor)``: workers x threads <= cores; ``workers="auto"``
    is as many as fit (``cores // threads``)."""
    threads = parse_threads(threads)
    workers = parse_workers(workers, threads)
    if workers == "auto":
        workers = max(1, cores() // threads)
    return workers, threads, parse_executor(executor)


def pool_context(threads: int):
    """The multiprocessing context for a pool of workers with ``threads`` torch threads.

    ``fork`` for one-thread workers: a forked child starts at once, with torch, normlab
    and the kernels the parent loaded (normlab runs its serial kernels there, and torch
    at one thread is safe in a forked child, as in DataLoader workers). ``spawn`` for
    more threads: a forked child of a process that used torch's thread pool must not
    start threads of its own; a fresh interpreter may.
    """
    import multiprocessing
    if threads == 1 and "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _ready() -> None:
    """A no-op task: submitting it starts a pool's processes."""


def start_pool(workers: int, threads: int):
    """A ``ProcessPoolExecutor`` whose ``workers`` processes are already running (forked
    here, before any helper thread such as a progress bar's exists)."""
    from concurrent.futures import ProcessPoolExecutor
    pool = ProcessPoolExecutor(workers, mp_context=pool_context(threads), initializer=_init_worker,
                               initargs=(threads, os.getpid()))
    pool.submit(_ready).result()
    return pool


@contextlib.contextmanager
def torch_threads(n: int):
    """``torch.set_num_threads(n)`` for the block, the old value restored after."""
    import torch
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def run_tasks(store, experiment: str, tasks: list[tuple[Callable, dict, int]], *, workers: int = 1,
              threads: int = 1, executor: str = "local", ray_address: str | None = None,
              label: str = "runs") -> dict:
    """Run ``tasks`` and store each record as its task finishes (this process writes alone).

    A record is ``{"config", "seed", "epochs", "final", "wall_s"}``. Returns
    ``{"ran": runs stored now, "wall_s": seconds, "workers", "executor"}``.
    """
    total = sum(n for _, _, n in tasks)
    ran, t0 = 0, time.perf_counter()

    def write(records: list[dict]) -> None:
        nonlocal ran
        for r in records:
            store.add(experiment, r["config"], r["seed"], r["epochs"], r["final"], r["wall_s"])
            ran += 1
        bar.advance(task_id, len(records))

    # a pool is started before the progress bar, whose refresh thread a forked child must not inherit
    pool = start_pool(workers, threads) if tasks and executor == "local" and workers > 1 else None
    try:
        with progress_bar() as bar:
            task_id = bar.add_task(f"{experiment} {label}", total=total)
            if not tasks:
                pass
            elif executor == "ray":
                _run_ray(tasks, write, workers, threads, ray_address)
            elif pool is None:
                with torch_threads(threads):
                    for fn, kwargs, _ in tasks:
                        write(fn(**kwargs))
            else:
                from concurrent.futures import as_completed
                futures = [pool.submit(fn, **kwargs) for fn, kwargs, _ in tasks]
                for f in as_completed(futures):
                    write(f.result())
    except BaseException:
        if pool is not None:
            # Ctrl-C or a failed task: drop what has not started, do not wait for it
            pool.shutdown(wait=False, cancel_futures=True)
        raise
    if pool is not None:
        pool.shutdown()
    return {"ran": ran, "wall_s": time.perf_counter() - t0, "workers": workers, "executor": executor,
            "threads": threads}


def _run_ray(tasks, write, workers: int, threads: int, address: str | None) -> None:
    import ray
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, num_cpus=None if address else cores(), include_dashboard=False,
                 log_to_driver=False)
    try:
        remote = ray.remote(num_cpus=threads)(_call)
        pending = [remote.remote(fn, kwargs, threads) for fn, kwargs, _ in tasks]
        while pending:
            finished, pending = ray.wait(pending, num_returns=1)
            for ref in finished:
                write(ray.get(ref))
    finally:
        if started:
            ray.shutdown()


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 torch thread``, ``2 torch threads``."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def count_runs(store_path: str) -> int:
    """Runs in the store at ``store_path`` (0 if it does not exist yet); opened read-only."""
    import sqlite3
    from pathlib import Path
    p = Path(store_path)
    if not p.is_file():
        return 0
    try:
        con = sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0)
        try:
            return con.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return 0


@contextlib.contextmanager
def interrupt_note(store_path: str):
    """Ctrl-C during a command: one line saying how many runs this command saved (the
    finished runs are kept), exit status 130. Said on stderr whether or not it is a
    terminal: a log shows it too."""
    before = count_runs(store_path)
    try:
        yield
    except KeyboardInterrupt:
        total = count_runs(store_path)
        sys.stderr.write(f"\ninterrupted: {plural(total - before, 'run')} saved by this command "
                         f"({total} in all) in {store_path}; run the same command again to resume\n")
        raise SystemExit(130) from None


def open_store(path: str):
    """The experiments' store, opened; a new store file says so on stderr (a mistyped path
    shows at once, not after the runs)."""
    from .store import Store
    st = Store(path)
    if st.created:
        sys.stderr.write(f"normlab: created a new store {path} (no runs stored yet)\n")
    return st


# --------------------------------------------------------------------------
# Summaries
# --------------------------------------------------------------------------

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
