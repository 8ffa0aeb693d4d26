"""The SQLite store: one record per run, unique, durable under kill -9, safe with two
writers, and bad paths refused before anything runs."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from normlab import cli
from normlab.experiments.store import Store, StoreError, check_path, config_key


def _rows(path):
    con = sqlite3.connect(path)
    try:
        return con.execute("SELECT id, experiment, config, seed, epochs, final FROM runs ORDER BY id").fetchall()
    finally:
        con.close()


def test_record_round_trip_and_unique_key(tmp_path):
    path = tmp_path / "s" / "runs.sqlite"
    path.parent.mkdir()                               # a new store goes into an existing folder
    with Store(path) as s:
        assert s.created
        assert s.add("exp", {"b": 2.0, "a": "x"}, 7, {"loss": [1.0, 0.5]}, {"acc": 0.75}, 0.25)
        # the same run again, keys in another order: ignored, the first record kept
        assert not s.add("exp", {"a": "x", "b": 2.0}, 7, {"loss": [9.0]}, {"acc": 0.0}, 1.0)
        assert s.add("exp", {"a": "x", "b": 2.0}, 8, {"loss": [1.0]}, {"acc": 0.5}, 1.0)
        (r, _) = s.runs("exp")
        assert s.done("exp") == {(config_key({"a": "x", "b": 2.0}), 7), (config_key({"a": "x", "b": 2.0}), 8)}
    assert r["config"] == {"a": "x", "b": 2.0} and r["seed"] == 7
    assert r["epochs"] == {"loss": [1.0, 0.5]} and r["final"] == {"acc": 0.75} and r["wall_s"] == 0.25
    import normlab
    import torch
    assert r["normlab"] == normlab.__version__ and r["torch"] == torch.__version__
    assert r["machine"]["cpu_count"] == os.cpu_count()
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_bad_paths_are_refused_without_touching_them(tmp_path):
    with pytest.raises(StoreError, match="is a directory"):
        check_path(tmp_path)
    text = tmp_path / "notes.txt"
    text.write_text("my notes, not a database\n")
    with pytest.raises(StoreError, match="not an SQLite file"):
        Store(text)
    assert text.read_text() == "my notes, not a database\n"
    with pytest.raises(StoreError, match="is a file, not a folder"):
        check_path(text / "runs.sqlite")
    ro = tmp_path / "ro.sqlite"
    Store(ro).close()
    ro.chmod(0o444)
    with pytest.raises(StoreError, match="read-only"):
        check_path(ro)
    ro_dir = tmp_path / "ro_dir"
    ro_dir.mkdir()
    ro_dir.chmod(0o555)
    try:
        with pytest.raises(StoreError, match="read-only"):
            check_path(ro_dir / "runs.sqlite")
        with pytest.raises(StoreError, match="does not exist"):     # a missing folder is named, not made
            check_path(ro_dir / "new" / "runs.sqlite")
    finally:
        ro_dir.chmod(0o755)
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE runs (x INTEGER)").connection.commit()
    with pytest.raises(StoreError, match="not a normlab store"):
        check_path(other)
    with pytest.raises(StoreError, match="no store at"):
        check_path(tmp_path / "missing.sqlite", must_exist=True)


def test_locked_store_is_refused(tmp_path):
    path = tmp_path / "runs.sqlite"
    Store(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreError, match="locked by another process"):
            check_path(path, lock_timeout_s=0.2)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    check_path(path, lock_timeout_s=0.2)             # free again


def test_cli_refuses_bad_store_before_any_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["experiment", "stability", "--quick", "--store", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "is a directory" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


_WRITER = textwrap.dedent("""
    import sys
    from normlab.experiments.store import Store
    path, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with Store(path) as s:
        for seed in range(lo, hi):
            s.add("exp", {"k": seed % 7}, seed, {"loss": [float(seed)]}, {"acc": seed / 1000}, 0.0)
""")


def test_two_processes_writing_at_once(tmp_path):
    path = tmp_path / "runs.sqlite"
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(lo), str(hi)])
             for lo, hi in ((0, 300), (150, 450))]          # 150 runs written by both
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    rows = _rows(path)
    keys = [(r[1], r[2], r[3]) for r in rows]
    assert len(keys) == len(set(keys)) == 450
    assert sorted(r[3] for r in rows) == list(range(450))
    assert all(json.loads(r[5])["acc"] == r[3] / 1000 for r in rows)
    assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


SWEEP = ["--norms", "none,batch,layer,rms,group", "--lrs", "0.1,0.3,1,2,4", "--seeds", "3"]
TOTAL = 5 * 5 * 3


def _study_count(path):
    try:
        con = sqlite3.connect(path, timeout=5)
        try:
            return con.execute("SELECT COUNT(*) FROM runs WHERE experiment = 'stability'").fetchone()[0]
        finally:
            con.close()
    except sqlite3.OperationalError:        # not created yet
        return 0


def _start_and_stop(path, sig):
    """Start the sweep; as soon as it has stored a study run more, send ``sig``."""
    start = _study_count(path)
    proc = subprocess.Popen([sys.executable, "-m", "normlab", "experiment", "stability", *SWEEP,
                             "--store", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while _study_count(path) == start:
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.005)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, err


def test_sweep_killed_then_resumed_loses_and_duplicates_nothing(tmp_path):
    path = tmp_path / "runs.sqlite"
    # Ctrl-C first: a one-line note, exit status 130, every finished run kept.
    code, err = _start_and_stop(path, signal.SIGINT)
    after_int = _rows(path)
    assert code == 130 and "run the same command again to resume" in err and "Traceback" not in err
    # Then kill -9 of a resumed sweep, mid-way.
    code, _ = _start_and_stop(path, signal.SIGKILL)
    assert code == -signal.SIGKILL
    before = _rows(path)
    n_study = sum(r[1] == "stability" for r in before)
    assert 0 < n_study < TOTAL, f"the sweep was not stopped mid-way ({n_study} of {TOTAL} stored)"
    assert before[:len(after_int)] == after_int              # nothing lost or rewritten
    # Resume to the end.
    assert cli.main(["experiment", "stability", *SWEEP, "--store", str(path)]) == 0
    after = _rows(path)
    assert after[:len(before)] == before                     # every run stored before is kept as it was
    study = [(r[2], r[3]) for r in after if r[1] == "stability"]
    assert len(study) == len(set(study)) == TOTAL            # none lost, none twice
    assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone()[0] == "ok"
