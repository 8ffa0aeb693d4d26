"""What every ``normlab bench`` suite shares: the output directory, option lists, thread
counts (torch's pool, which normlab's kernels share), the progress bar and the run's metadata."""

from __future__ import annotations

import os
import platform
import tempfile
import time
from collections.abc import Callable, Sequence

import torch

DEFAULT_OUT = "bench-results"
# what --repeats and --warmup count, for their error messages
REPEATS_MEANING = "timed samples of each provider"
WARMUP_MEANING = "untimed samples of each provider before the timed ones"


def listify(value, what: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = value.split(",")
    items = [str(v).strip() for v in value if str(v).strip()]
    if not items:
        raise ValueError(f"normlab bench: expected at least one {what}, got {value!r}")
    return items


def choose(value, allowed: Sequence[str], what: str, aliases=None) -> list[str] | None:
    items = listify(value, what)
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


def check_count(value, option: str, least: int, meaning: str) -> int:
    """``value`` as a whole number >= ``least``; else ValueError naming ``--option`` and the value."""
    try:
        n = int(value)
        if isinstance(value, float) and value != n:
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError(f"normlab bench: --{option}: expected a whole number >= {least} ({meaning}), "
                         f"got {value!r}") from None
    if n < least:
        raise ValueError(f"normlab bench: --{option}: expected a whole number >= {least} ({meaning}), got {n}; "
                         f"give --{option} {least} or more")
    return n


def make_out(out) -> str:
    """The output folder, made ready once every other option is checked: an existing folder or a
    new one (with its parents). An empty path, a file, a path under a file or a folder this user
    cannot write to raises ValueError, and nothing is created."""
    text = "" if out is None else str(out)
    if not text.strip():
        raise ValueError("normlab bench: --out must name a folder (e.g. --out bench-results), got an empty path")
    path = os.path.expanduser(text)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"normlab bench: --out {text} exists and is not a folder; give the path of a folder "
                         f"(new or existing) for the result files")
    parent = os.path.abspath(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"normlab bench: --out {text} lies under {parent}, which is a file, not a folder; "
                         f"give a folder path")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):  # can this user write here?
            pass
    except OSError as e:
        raise ValueError(f"normlab bench: cannot write into --out {text}: {e.strerror or e}; "
                         f"give a folder this user can write to") from None
    return path


def set_threads(n: int) -> None:
    torch.set_num_threads(n)  # normlab's kernels run on torch's pool: one count for both


def get_threads() -> int:
    return torch.get_num_threads()


def thread_guard(n: int, warnings: list[str], console) -> Callable[[str], None]:
    """After each call of ``provider``: if the thread count is no longer ``n``, warn once
    and set it back, so that a provider that changes it cannot skew the ones timed after it."""
    def guard(provider: str) -> None:
        got = torch.get_num_threads()
        if got != n:
            msg = (f"{provider} changed torch.get_num_threads() from {n} to {got}; "
                   f"set back to {n} (it would leak into the providers timed after it)")
            if msg not in warnings:
                warnings.append(msg)
                if console is not None:
                    console.print(f"[yellow]warning: {msg}[/]")
            set_threads(n)
    return guard


def progress_bar(show: bool):
    """The rich progress bar of a bench run, on stderr (hidden unless ``show``)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=Console(stderr=True), disable=not show)


def run_meta(options: dict) -> dict:
    from .._backend import available_backends
    from .._version import __version__
    from ..ops import extension
    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "options": options,
        "normlab": __version__, "torch": torch.__version__,
        "extension": (extension.cpu_level() or {}).get("level"), "python": platform.python_version(),
        "extension_level_reason": (extension.cpu_level() or {}).get("reason"),
        "backends": available_backends(),
        "machine": platform.machine(), "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "loadavg_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
