"""The sweep runner: tasks -- ``(function, kwargs, n_runs)`` with a module-level
``function(**kwargs) -> [record, ...]`` -- run here, in a pool of processes (``workers``) or on a
Ray cluster (``executor="ray"``). Only this process, the driver, writes the store: one
transaction per record, as each task finishes.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Callable

from .arguments import cores, parse_executor, parse_threads, parse_workers
from .summaries import plural


def show_progress() -> bool:
    """A bar only for a person at a terminal: not in CI logs, pipes or files."""
    return sys.stdout.isatty() and sys.stderr.isatty()


def progress_bar(show: bool | None = None):
    """A rich progress bar over runs, with an ETA, on stderr."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
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
