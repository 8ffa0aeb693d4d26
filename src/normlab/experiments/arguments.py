"""The experiments' command-line arguments: checks and the options every experiment takes.

Each check raises ``ValueError`` with what was expected, what was given and the fix; the
``arg_*`` wrappers turn them into argparse errors, so the command line reports bad input in
one line before any run starts.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from typing import Callable, Iterable, Sequence

from .store import DEFAULT_STORE, StoreError, check_path
from .summaries import plural

EXECUTORS = ("local", "ray")


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
    """An argparse ``type=``: ``check(text)``, its ValueError/StoreError as an argparse error
    (without the check's own "normlab COMMAND: " prefix: argparse's line names the command and
    the option already)."""
    def wrapped(text):
        try:
            return check(text)
        except (ValueError, StoreError) as e:
            raise argparse.ArgumentTypeError(re.sub(r"^normlab [a-z -]+?: ", "", str(e))) from None
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


def add_common_arguments(p: argparse.ArgumentParser, quick: str) -> None:
    """``--store``, ``--workers``, ``--executor``, ``--ray-address``, and ``--quick`` described by
    ``quick`` (the experiment's own small sweep and how long it takes)."""
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
    p.add_argument("--quick", action="store_true", help=f"a small sweep (CI, README): {quick}")
