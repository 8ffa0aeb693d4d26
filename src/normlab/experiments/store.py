"""The results store: one SQLite file (Python's ``sqlite3``), a row per finished run.

A record holds the experiment's name, its configuration (canonical JSON: sorted keys,
no spaces), the weight seed, the per-epoch metrics and the final metrics (JSON), the
wall time, the normlab and torch versions and the machine. ``(experiment, config,
seed)`` is a unique key, so a re-run skips what is stored and a run is never stored
twice.

Durability and concurrency:

- WAL journal mode with ``synchronous=NORMAL``: a commit survives the writing process
  being killed (``kill -9``, Ctrl-C) at any point; only an operating-system crash or
  power loss may drop the last commits, never corrupt the file.
- Each record is written in its own transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``),
  so a sweep killed between two runs keeps every run it finished.
- ``INSERT OR IGNORE`` on the unique key: two processes running the same sweep at once
  both write, and the second copy of a run is dropped; ``busy_timeout`` makes each
  writer wait its turn instead of failing.

Bad paths (a directory, a file that is not SQLite, a read-only file or folder, a folder
that does not exist, a store locked by another process) raise :class:`StoreError` from :func:`check_path`, before
any run starts and without creating anything.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sqlite3
import stat
import time
from pathlib import Path
from typing import Any, Iterable

from .._version import __version__

DEFAULT_STORE = os.path.join("normlab-runs", "runs.sqlite")
SCHEMA_VERSION = 1
COLUMNS = ("id", "experiment", "config", "seed", "epochs", "final", "wall_s",
           "normlab", "torch", "machine", "created")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id         INTEGER PRIMARY KEY,
    experiment TEXT    NOT NULL,
    config     TEXT    NOT NULL,  -- canonical JSON (sorted keys)
    seed       INTEGER NOT NULL,
    epochs     TEXT    NOT NULL,  -- JSON: {metric: [value per epoch]}
    final      TEXT    NOT NULL,  -- JSON: {metric: value}
    wall_s     REAL    NOT NULL,
    normlab    TEXT    NOT NULL,
    torch      TEXT    NOT NULL,
    machine    TEXT    NOT NULL,  -- JSON
    created    TEXT    NOT NULL,
    UNIQUE (experiment, config, seed)
)
"""
_HEADER = b"SQLite format 3\x00"


class StoreError(RuntimeError):
    """A store path that cannot be used; the message says why and what to do."""


def config_key(config: dict) -> str:
    """The canonical JSON of a configuration: the same dict always gives the same text."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def _writable(p: Path) -> bool:
    # os.access alone says yes to root for a 0444 file; the mode bits say what was meant.
    return os.access(p, os.W_OK) and bool(p.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _is_default(p: Path) -> bool:
    return os.path.normpath(str(p)) == os.path.normpath(DEFAULT_STORE)


def check_path(path: str | os.PathLike, *, must_exist: bool = False, read_only: bool = False,
               lock_timeout_s: float = 10.0) -> Path:
    """Check that ``path`` can serve as a store; create nothing. Returns it as a Path.

    Raises :class:`StoreError` for a directory, a file that is not SQLite, a read-only
    file or folder, a new store whose folder does not exist (except the default store's
    ``normlab-runs/``, which is created), a missing store when ``must_exist``, or a store
    another process keeps locked for more than ``lock_timeout_s`` seconds. ``read_only``
    (a report): the store must exist, may be a read-only file, and is opened only to read.
    """
    p = Path(path)
    must_exist = must_exist or read_only
    fix = "pass --store with a path to a new or existing normlab store file"
    if p.is_dir():
        raise StoreError(f"store path {str(p)!r} is a directory; expected an SQLite file "
                         f"(e.g. {str(p / 'runs.sqlite')!r}); {fix}")
    if not p.exists():
        if must_exist:
            raise StoreError(f"no store at {str(p)!r}; run an experiment first "
                             f"(normlab experiment stability --quick) or pass --store with an existing store")
        parent = p.parent
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir():
            raise StoreError(f"cannot create store {str(p)!r}: {str(parent)!r} is a file, not a folder; {fix}")
        if parent != p.parent and not _is_default(p):
            # a mistyped folder must not start a fresh store somewhere new (sqlite3 refuses too);
            # only the default store's folder, normlab-runs/, is created
            raise StoreError(f"cannot create store {str(p)!r}: its folder {str(p.parent)!r} does not exist; "
                             f"check the path, or create the folder first (mkdir -p {str(p.parent)!r})")
        if not _writable(parent):
            raise StoreError(f"cannot create store {str(p)!r}: folder {str(parent)!r} is read-only; {fix}")
        return p
    if not p.is_file():
        raise StoreError(f"store path {str(p)!r} is not a regular file; {fix}")
    with open(p, "rb") as f:
        head = f.read(len(_HEADER))
    if head and head != _HEADER:
        raise StoreError(f"{str(p)!r} is not an SQLite file (it starts with {head[:8]!r}); "
                         f"normlab will not overwrite it; {fix}")
    if read_only:
        return _check_readable(p, lock_timeout_s, fix)
    if not _writable(p):
        raise StoreError(f"store {str(p)!r} is read-only; make it writable (chmod u+w) or {fix}")
    if not _writable(p.parent):
        raise StoreError(f"store {str(p)!r} is in a read-only folder (SQLite needs to create "
                         f"{p.name}-wal beside it); {fix}")
    with _sqlite_errors(p, lock_timeout_s, fix, "opened"):
        con = sqlite3.connect(p, timeout=lock_timeout_s, isolation_level=None)
        try:
            cols = [r[1] for r in con.execute("PRAGMA table_info(runs)")]
            if cols and tuple(cols) != COLUMNS:
                raise StoreError(f"{str(p)!r} is an SQLite file whose table 'runs' is not a normlab "
                                 f"store's (columns {cols}); {fix}")
            con.execute("BEGIN IMMEDIATE")
            con.execute("ROLLBACK")
        finally:
            con.close()
    return p


@contextlib.contextmanager
def _sqlite_errors(p: Path, timeout_s: float, fix: str, opened: str):
    """sqlite3's errors while ``p`` is being checked, as one StoreError each that says what to do."""
    try:
        yield
    except sqlite3.OperationalError as e:
        if "locked" in str(e) or "busy" in str(e):
            raise StoreError(f"store {str(p)!r} is locked by another process (a write held for more "
                             f"than {timeout_s:g} s); wait for it to finish or use another --store") from e
        raise StoreError(f"store {str(p)!r} cannot be {opened}: {e}; {fix}") from e
    except sqlite3.DatabaseError as e:
        raise StoreError(f"{str(p)!r} is not a usable SQLite file ({e}); {fix}") from e


def _connect_read_only(p: Path, timeout_s: float) -> sqlite3.Connection:
    """``p`` opened for reading only (SQLite's ``mode=ro``): nothing is written to the file.

    A WAL store with no ``-wal`` file beside it (no writer has it open; every run is in the
    file itself) is opened ``immutable``: ``mode=ro`` alone would create ``-wal`` and ``-shm``
    beside it and, being read-only, leave them there (and fail in a read-only folder).
    """
    with open(p, "rb") as f:
        wal = f.read(20)[18:19] == b"\x02"  # the header's file-format byte: 2 = WAL
    immutable = "&immutable=1" if wal and not Path(f"{p}-wal").exists() else ""
    return sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro{immutable}", uri=True, timeout=timeout_s,
                           isolation_level=None)


def _check_readable(p: Path, timeout_s: float, fix: str) -> Path:
    with _sqlite_errors(p, timeout_s, fix, "opened for reading"):
        con = _connect_read_only(p, timeout_s)
        try:
            cols = [r[1] for r in con.execute("PRAGMA table_info(runs)")]
        finally:
            con.close()
    if tuple(cols) != COLUMNS:
        raise StoreError(f"{str(p)!r} is an SQLite file without a normlab store's table 'runs' "
                         f"(columns {cols}); {fix}")
    return p


def machine() -> dict:
    """Where a run ran: host, architecture, processor, core count, Python."""
    return {"node": platform.node(), "machine": platform.machine(), "processor": platform.processor(),
            "system": platform.system(), "cpu_count": os.cpu_count(), "python": platform.python_version()}


class Store:
    """An open store. Use as a context manager, or call :meth:`close`. ``read_only=True`` (a
    report): an existing store opened for reading only (SQLite ``mode=ro``), its file untouched.

    >>> with Store("/tmp/normlab-doctest.sqlite") as s:      # doctest: +SKIP
    ...     s.add("stability", {"norm": "batch", "lr": 2.0}, 123, {"train_loss": [0.56]}, {"eval_acc": 0.877}, 0.1)
    """

    def __init__(self, path: str | os.PathLike = DEFAULT_STORE, *, must_exist: bool = False,
                 read_only: bool = False, timeout_s: float = 30.0) -> None:
        self.path = check_path(path, must_exist=must_exist, read_only=read_only, lock_timeout_s=timeout_s)
        #: True when this call made a new store file
        self.created = not self.path.exists()
        import torch
        self._versions = (__version__, torch.__version__, json.dumps(machine(), sort_keys=True))
        if read_only:
            self._con = _connect_read_only(self.path, timeout_s)
            return
        if _is_default(self.path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
        # autocommit mode: every transaction below is opened and closed explicitly
        self._con = sqlite3.connect(self.path, timeout=timeout_s, isolation_level=None)
        self._con.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
        self._con.execute("PRAGMA journal_mode = WAL")
        self._con.execute("PRAGMA synchronous = NORMAL")
        with self._transaction():
            self._con.execute(_SCHEMA)
            self._con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _transaction(self):
        con = self._con

        class _Tx:
            def __enter__(self):
                con.execute("BEGIN IMMEDIATE")

            def __exit__(self, exc_type, exc, tb):
                con.execute("COMMIT" if exc_type is None else "ROLLBACK")
                return False
        return _Tx()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._con.close()

    def add(self, experiment: str, config: dict, seed: int, epochs: dict, final: dict, wall_s: float) -> bool:
        """Store one finished run in its own transaction. False if it was stored already."""
        n, t, m = self._versions
        with self._transaction():
            cur = self._con.execute(
                "INSERT OR IGNORE INTO runs (experiment, config, seed, epochs, final, wall_s, normlab, torch,"
                " machine, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (experiment, config_key(config), int(seed), json.dumps(epochs), json.dumps(final),
                 float(wall_s), n, t, m, time.strftime("%Y-%m-%dT%H:%M:%S%z")))
        return cur.rowcount == 1

    def done(self, experiment: str) -> set[tuple[str, int]]:
        """``{(config_key, seed)}`` of the runs of ``experiment`` already stored."""
        rows = self._con.execute("SELECT config, seed FROM runs WHERE experiment = ?", (experiment,))
        return {(c, s) for c, s in rows}

    def runs(self, experiment: str | None = None, configs: Iterable[dict] | None = None) -> list[dict[str, Any]]:
        """Stored runs (JSON decoded), in the order they were stored; optionally only
        those of ``experiment`` and with a configuration in ``configs``."""
        sql, args = "SELECT * FROM runs", []
        if experiment is not None:
            sql, args = sql + " WHERE experiment = ?", [experiment]
        keys = None if configs is None else {config_key(c) for c in configs}
        out = []
        for row in self._con.execute(sql + " ORDER BY id", args):
            r = dict(zip(COLUMNS, row))
            if keys is not None and r["config"] not in keys:
                continue
            for k in ("config", "epochs", "final", "machine"):
                r[k] = json.loads(r[k])
            out.append(r)
        return out

    def experiments(self) -> list[str]:
        return [r[0] for r in self._con.execute("SELECT DISTINCT experiment FROM runs ORDER BY experiment")]
