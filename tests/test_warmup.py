"""``normlab warmup`` and the stderr notice before a kernel compiles."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

import normlab
from normlab import cli
from normlab.ops import _launch
from normlab.warmup import targets

pytestmark = pytest.mark.skipif(not _launch.available(), reason="numba not installed")


def _fresh_module(tmp_path, name):
    """A module with one cached jitted function, its numba cache in ``tmp_path`` (never compiled yet)."""
    src = tmp_path / f"{name}.py"
    src.write_text("from numba import njit\n\n@njit(cache=True)\ndef twice_at(a):\n    return 2 * a\n")
    spec = importlib.util.spec_from_file_location(name, src)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_compile_is_announced_once_on_stderr(tmp_path, capsys):
    fn = _fresh_module(tmp_path, "nl_notice_a").twice_at
    assert _launch.call(fn, "k", 21) == 42
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("normlab: compiling the twice kernel for k")
    assert "normlab warmup" in err
    assert _launch.call(fn, "k", 4) == 8  # the entry point now: nothing to say
    assert capsys.readouterr().err == ""


def test_a_kernel_cached_on_disk_is_not_announced(tmp_path, capsys):
    first = _fresh_module(tmp_path, "nl_notice_b").twice_at
    _launch.call(first, "k", 1)  # compiles and writes the disk cache
    capsys.readouterr()
    again = _fresh_module(tmp_path, "nl_notice_b").twice_at  # a new dispatcher, as in a new process
    assert not again.overloads
    assert _launch.call(again, "k", 5) == 10
    assert capsys.readouterr().err == ""


def test_warmup_runs_every_family_in_the_versions_asked_for():
    seconds = normlab.warmup(dtypes=("float32",), parallel=False)
    assert list(seconds) == ["layer_norm float32 serial", "batch_norm float32 serial", "group_norm float32 serial"]
    assert all(s >= 0 for s in seconds.values())
    labels = [label for label, _ in targets(("float32", "bfloat16"), parallel=True)]
    assert len(labels) == 12 and labels[0].endswith("serial") and labels[-1].endswith("parallel")


def test_warmup_rejects_unknown_dtypes_before_any_work(capsys):
    with pytest.raises(ValueError, match="expected dtypes from"):
        normlab.warmup(dtypes=("float8",))
    # the command prints the message (no traceback) and exits with 2
    assert cli.main(["warmup", "--dtypes", "float32,int8"]) == 2
    err = capsys.readouterr().err
    assert "expected dtypes from" in err and "Traceback" not in err


def test_warmup_command_reports_each_group(capsys):
    assert cli.main(["warmup", "--dtypes", "float32", "--serial-only"]) == 0
    out = capsys.readouterr().out
    assert "layer_norm float32 serial" in out and "group_norm float32 serial" in out
    assert "3 kernel groups ready" in out


def test_warmup_progress_callback_sees_every_target():
    seen = []
    normlab.warmup(dtypes=("float32",), parallel=False, progress=lambda label, done, total: seen.append((done, total)))
    assert seen == [(0, 3), (1, 3), (2, 3), (3, 3)]
