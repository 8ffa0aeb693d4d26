"""The command line as a user types it: no abbreviations (``--lr 2`` is not ``--lrs 2``), and
an unknown or abbreviated flag is answered with the subcommand's own usage, exit status 2,
no traceback, nothing run or created."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from normlab import cli

ENV = {**os.environ, "NORMLAB_BACKEND": "ref"}


def _normlab(cwd, *argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "normlab.cli", *argv], capture_output=True, text=True, cwd=cwd,
                          env=ENV, timeout=120)


@pytest.mark.parametrize("argv,usage,bad", [
    (["experiment", "stability", "--lr", "2"], "usage: normlab experiment stability", "--lr 2"),
    (["experiment", "stability", "--epochs", "5"], "usage: normlab experiment stability", "--epochs 5"),
    (["experiment", "batch-size", "--seed", "1"], "usage: normlab experiment batch-size", "--seed 1"),
    (["compare", "--se", "1"], "usage: normlab compare", "--se 1"),
    (["demo", "shapes", "--samp", "0"], "usage: normlab demo shapes", "--samp"),
])
def test_unknown_or_abbreviated_flag(tmp_path, argv, usage, bad):
    p = _normlab(tmp_path, *argv)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith(usage)
    assert f"unrecognized arguments: {bad}" in p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""
    assert list(tmp_path.iterdir()) == []                 # no store, no report folder


def test_every_parser_refuses_abbreviations():
    parser = cli.build_parser()
    seen = [parser]
    while seen:
        p = seen.pop()
        assert p.allow_abbrev is False, p.prog
        for action in p._actions:
            if action.choices and isinstance(action.choices, dict):
                seen += list(action.choices.values())


@pytest.mark.parametrize("topic, says", [("stability", "5 norms x lr 0.1, 1, 2, 4 x 4 seeds"),
                                         ("batch-size", "BatchNorm and GroupNorm x batch 8, 32, 128"),
                                         ("train-eval", "BatchNorm and LayerNorm x 3 seeds")])
def test_each_experiment_describes_its_own_quick_sweep(topic, says, capsys):
    with pytest.raises(SystemExit):
        cli.main(["experiment", topic, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"--quick a small sweep (CI, README): {says}" in text
    assert "stability --quick" not in text          # batch-size's help once gave the stability study's time
