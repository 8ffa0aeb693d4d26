"""What a newcomer trips over, run as the newcomer runs it: each bad path or value gets one
clear line and exit status 2 (no traceback), nothing is created or lost; a new store says
so; Ctrl-C says how many runs were saved; counts read as English ("1 learning rate")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from normlab.experiments import arguments, summaries, sweep
from normlab.experiments import stability
from normlab.experiments._mlp import chance_limit, failure

ENV = {**os.environ, "NORMLAB_BACKEND": "ref"}


def _normlab(cwd, *argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "normlab.cli", *argv], capture_output=True, text=True, cwd=cwd,
                          env=ENV, timeout=600)


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# ---------------------------------------------------------------- the store's folder

def test_store_in_a_missing_folder_is_refused(tmp_path):
    store = tmp_path / "nonexistent" / "dir" / "runs.sqlite"
    p = _normlab(tmp_path, "experiment", "stability", "--quick", "--store", str(store))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert f"its folder '{store.parent}' does not exist" in p.stderr
    assert p.stderr.startswith("usage: normlab experiment stability")
    assert _tree(tmp_path) == []                                   # nothing created


def test_new_store_file_is_announced_and_plurals_read_well(tmp_path):
    store = tmp_path / "new.sqlite"
    argv = ("experiment", "stability", "--norms", "none", "--lrs", "0.1", "--seeds", "1", "--workers", "1",
            "--store", str(store))
    p = _normlab(tmp_path, *argv)
    assert p.returncode == 0, p.stderr
    assert f"created a new store {store}" in p.stderr
    assert "1 norm x 1 learning rate x 1 seed (123..123)" in p.stdout
    assert "1 process x 1 torch thread," in p.stdout and "threads" not in p.stdout.split("trained")[1]
    again = _normlab(tmp_path, *argv)
    assert again.returncode == 0 and "created a new store" not in again.stderr
    assert "all 1 run was already in the store" in again.stdout


def test_default_store_folder_is_still_created(tmp_path):
    from normlab.experiments.store import DEFAULT_STORE, check_path
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert str(check_path(DEFAULT_STORE)) == DEFAULT_STORE           # normlab-runs/ may be missing
        with sweep.open_store(DEFAULT_STORE) as st:
            assert st.created
        assert (tmp_path / DEFAULT_STORE).is_file()
    finally:
        os.chdir(cwd)


# ---------------------------------------------------------------- values

def test_infinite_learning_rate_says_so(tmp_path):
    p = _normlab(tmp_path, "experiment", "stability", "--lrs", "1e999")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "expected finite numbers, got 1e999" in p.stderr and "<= 0" not in p.stderr
    assert _tree(tmp_path) == []
    with pytest.raises(ValueError, match="SGD with lr <= 0 does not train"):
        arguments.parse_lrs("0.1,-1")


def test_plurals():
    assert summaries.plural(1, "torch thread") == "1 torch thread" and summaries.plural(2, "torch thread") == "2 torch threads"
    assert summaries.plural(1, "process", "processes") == "1 process"
    line = summaries.speed_line({"ran": 1, "wall_s": 1.0, "workers": 1, "threads": 1, "executor": "local"}, 1)
    assert "trained 1 run in" in line and "1 process x 1 torch thread," in line and "1 run already stored was" in line


# ---------------------------------------------------------------- Ctrl-C

def test_interrupt_says_how_many_runs_were_saved(tmp_path, monkeypatch, capsys):
    store = tmp_path / "runs.sqlite"
    real = sweep.run_tasks

    def one_then_ctrl_c(st, experiment, tasks, **kw):
        if experiment == stability.EXPERIMENT:
            fn, kwargs, _ = tasks[0]
            r = fn(**{**kwargs, "members": kwargs["members"][:1]})[0]
            st.add(experiment, r["config"], r["seed"], r["epochs"], r["final"], r["wall_s"])
            raise KeyboardInterrupt
        return real(st, experiment, tasks, **kw)

    monkeypatch.setattr(sweep, "run_tasks", one_then_ctrl_c)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)         # not a terminal: a log
    with pytest.raises(SystemExit) as e:
        stability.run(norms="none", lrs="0.1", seeds=2, workers=1, store=str(store))
    assert e.value.code == 130
    err = capsys.readouterr().err
    # the chapter's 2 runs and the one study run were stored by this command
    assert f"interrupted: 3 runs saved by this command (3 in all) in {store}" in err
    assert "run the same command again to resume" in err


# ---------------------------------------------------------------- failing to train

def test_failure_rule():
    assert chance_limit() == pytest.approx(0.5577, abs=1e-4)
    assert failure([0.7, 0.3], 0.3, 0.88) is None
    assert failure([0.7, float("nan")], 1.0, 0.88) == "non-finite"
    assert failure([0.7, 0.3], float("inf"), 0.88) == "non-finite"
    # the LayerNorm run at lr 2, seed 124: at chance, last loss 2.08 < 10x 0.71 (the old rule said fine)
    assert failure([0.71, 2.08], 11.6, 0.5) == "chance"
    assert failure([0.7, 0.3], 0.3, 0.558) is None and failure([0.7, 0.3], 0.3, 0.5577) == "chance"
    assert failure([0.7, 0.9], 0.4, 0.86) == "loss"


def test_study_counts_stored_runs_with_the_new_rule(tmp_path):
    from normlab.experiments.store import Store
    store = tmp_path / "runs.sqlite"
    with Store(store) as st:          # runs stored by an older normlab: "diverged" only, by the old rule
        for seed, (first, last, acc) in zip((123, 124), ((0.71, 2.08, 0.5), (0.7, 0.3, 0.88))):
            st.add("stability", stability.config("layer", 2.0), seed, {"train_loss": [first] * 29 + [last]},
                   {"eval_acc": acc, "eval_loss": 11.6, "train_loss": last, "diverged": False}, 0.1)
        runs = st.runs("stability")
    (cell,) = stability.summarize(runs, ["layer"], [2.0])
    assert cell["failed"] == 0.5 and cell["failures"] == {"non-finite": 0, "chance": 1, "loss": 0}
    assert cell["diverged"] == 0.0                                   # the old rule, kept for old figures


def test_chapter_accuracy_placed_among_the_runs():
    sp = stability.percentile_among(0.520, [0.5, 0.5, 0.52, 0.777])
    assert (sp["below"], sp["equal"], sp["n"]) == (2, 1, 4) and sp["percentile"] == 62.5
    text = stability.spread_line(sp)
    assert "percentile 62" in text and "0.520" in text and "4 runs" in text
