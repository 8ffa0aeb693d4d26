"""Real multi-process runs for the distributed tests: a gloo group on 127.0.0.1.

:func:`run` starts ``world`` processes with ``torch.multiprocessing`` (spawn),
each joins one gloo group (a free port, a short timeout) and calls
``worker(rank, world, *args)`` -- a module-level function, so that a spawned
child can import it. Each rank's return value (or its traceback) comes back
through a file; a process that dies or overruns is reported as such. One spawn
costs seconds (every child imports torch), so a test batches many checks into
one worker.
"""

from __future__ import annotations

import datetime
import importlib
import os
import socket
import tempfile
import time
import traceback

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_out_path = None  # in a child: where its result goes


def report(value) -> None:
    """Write this rank's result now (for a worker about to die on purpose)."""
    torch.save({"ok": value}, _out_path)


def _child(rank, world, port, target, args, out_dir, timeout_s, backend):
    global _out_path
    torch.set_num_threads(1)  # 2 or 3 ranks share the test machine's cores
    import torch.distributed as dist

    if backend == "nccl":
        torch.cuda.set_device(rank)
    _out_path = os.path.join(out_dir, f"{rank}.pt")
    module, name = target
    result = None
    try:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        result = {"ok": getattr(importlib.import_module(module), name)(rank, world, *args)}
    except BaseException:  # noqa: BLE001 - reported to the parent
        result = {"error": traceback.format_exc()}
    torch.save(result, _out_path)
    if "error" not in result and dist.is_initialized():
        dist.destroy_process_group()


def run(worker, world: int, *args, timeout_s: float = 20.0, deadline_s: float = 120.0, backend: str = "gloo"):
    """Run ``worker(rank, world, *args)`` on ``world`` spawned ranks; returns their results in rank order.

    ``timeout_s``: the group's collective timeout; ``backend``: ``"gloo"``, or
    ``"nccl"`` (rank r on ``cuda:r``). Raises AssertionError naming
    the rank when a rank raised (with its traceback), died without a result
    (:func:`report` lets a rank that dies on purpose leave one), or did not
    finish within ``deadline_s``.
    """
    results = run_raw(worker, world, *args, timeout_s=timeout_s, deadline_s=deadline_s, backend=backend)
    for rank, r in enumerate(results):
        if "error" in r:
            raise AssertionError(f"rank {rank} of {world} failed:\n{r['error']}")
        if "ok" not in r:
            raise AssertionError(f"rank {rank} of {world} died (exit code {r['exitcode']}) without a result")
    return [r["ok"] for r in results]


def run_raw(worker, world: int, *args, timeout_s: float = 20.0, deadline_s: float = 120.0, backend: str = "gloo"):
    """As :func:`run`, but a rank's result is ``{"ok": value}`` or ``{"error": traceback}`` (or
    neither, when it died without writing one), plus ``"exitcode"``."""
    target = (worker.__module__, worker.__name__)
    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.start_processes(_child, args=(world, free_port(), target, args, out_dir, timeout_s, backend),
                                 nprocs=world, join=False, start_method="spawn")
        end = time.monotonic() + deadline_s
        for p in ctx.processes:
            p.join(max(0.0, end - time.monotonic()))
        stuck = [rank for rank, p in enumerate(ctx.processes) if p.is_alive()]
        for rank in stuck:
            ctx.processes[rank].kill()
        if stuck:
            raise AssertionError(f"ranks {stuck} of {world} still running after {deadline_s} s (a hang)")
        results = []
        for rank, p in enumerate(ctx.processes):
            path = os.path.join(out_dir, f"{rank}.pt")
            r = torch.load(path, weights_only=False) if os.path.exists(path) else {}
            results.append(dict(r, exitcode=p.exitcode))
        return results
