"""Every ``normlab`` subcommand through its entry point, with real arguments and with bad ones.

Good runs go through ``python -m normlab`` in a fresh interpreter, as a user runs it, with
the smallest real arguments (one op, one shape, one seed): exit status 0, no traceback, the
output parses and says what was computed, the files it names exist. The oracles are outside
the command: what this process knows of the install (``normlab.ops.extension``), what a
BatchNorm in train mode does to a batch (mixes it) and a GroupNorm does not, the rows in the
SQLite store the run wrote.

Bad runs call ``normlab.cli.main(argv)`` in this process (every one fails before any work):
the exit status, a message that names the option and the value that were wrong, nothing
created. An exception escaping ``main`` is the traceback a user would see, so it fails the
test. Those that reach a computation before failing run in a subprocess.

``test_every_command_has_a_good_and_a_bad_run`` keeps the list complete: each leaf of
``normlab.cli.COMMANDS`` has a good run and a bad run here, or names the test elsewhere
that runs it.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from normlab import cli
from normlab.ops import extension
from tests.bench.files import csv_rows

ROOT = Path(__file__).resolve().parents[2]
MODEL = """\
from torch import nn


def build():
    return nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.GroupNorm(2, 4))
"""


def _normlab(cwd, *argv, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "normlab", *argv], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout)


def _ok(p: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    return p


# --- good runs -----------------------------------------------------------------------------------

def test_bench_one_op_one_shape_writes_what_it_prints(tmp_path):
    out = tmp_path / "bench"
    providers = "normlab-cpu,torch" if extension.available() else "normlab-ref,torch"
    p = _ok(_normlab(tmp_path, "bench", "--ops", "rms_norm", "--sizes", "4x6", "--modes", "forward",
                     "--providers", providers, "--dtypes", "float32", "--threads", "1", "--repeats", "1",
                     "--warmup", "0", "--out", str(out), "--json"))
    r = json.loads(p.stdout)
    assert [(row["op"], row["shape"], row["provider"], row["status"]) for row in r["rows"]] == [
        ("rms_norm", "4x6", name, "ok") for name in providers.split(",")]
    assert all(row["median_s"] > 0 and row["threads"] == 1 for row in r["rows"])
    assert r["files"]["csv"] == str(out / "bench.csv") and r["files"]["json"] == str(out / "bench.json")
    assert [(row["op"], row["provider"]) for row in csv_rows(out / "bench.csv")] == [
        ("rms_norm", name) for name in providers.split(",")]
    assert all(Path(png).is_file() for png in r["files"]["png"])


def _stored(store: Path) -> list[tuple]:
    with sqlite3.connect(store) as db:
        return db.execute("SELECT experiment FROM runs").fetchall()


def test_experiment_batch_size_then_report_on_its_store(tmp_path):
    store = tmp_path / "runs.sqlite"
    p = _ok(_normlab(tmp_path, "experiment", "batch-size", "--norms", "batch", "--batch-sizes", "64",
                     "--seeds", "1", "--epochs", "1", "--workers", "1", "--store", str(store)))
    assert "B=64" in p.stdout and str(store) in p.stdout
    (accuracy,) = re.findall(r"BatchNorm2d +(\d\.\d{3}) ±", p.stdout)
    assert _stored(store) == [("batch-size",)]          # one norm x one batch size x one seed

    out = tmp_path / "report"
    p = _ok(_normlab(tmp_path, "report", "--store", str(store), "--out", str(out)))
    assert {"report.md", "report.html", "runs.csv"} <= {f.name for f in out.iterdir()}
    assert len(csv_rows(out / "runs.csv")) == 1
    report = (out / "report.md").read_text()
    assert f"| BatchNorm | {accuracy} ± 0.000" in report            # the run printed and the report agree
    assert (out / "accuracy_vs_batch_size.png").is_file() and "accuracy_vs_batch_size.png" in report


def test_experiment_train_eval_one_seed(tmp_path):
    store = tmp_path / "runs.sqlite"
    p = _ok(_normlab(tmp_path, "experiment", "train-eval", "--norms", "batch,layer", "--seeds", "1",
                     "--workers", "1", "--store", str(store), "--json"))
    json.loads(p.stdout)
    assert len(_stored(store)) == 2                       # BatchNorm and LayerNorm, one seed each
    text = _ok(_normlab(tmp_path, "experiment", "train-eval", "--norms", "batch,layer", "--seeds", "1",
                        "--workers", "1", "--store", str(store))).stdout
    assert "BatchNorm1d" in text and "LayerNorm" in text
    assert len(_stored(store)) == 2                       # the second run read them back


def test_inspect_a_model_from_a_py_file(tmp_path):
    (tmp_path / "model.py").write_text(MODEL)
    p = _ok(_normlab(tmp_path, "inspect", "model.py:build", "--input-shape", "4,3,8,8", "--json"))
    r = json.loads(p.stdout)
    layers = {layer["name"]: layer for layer in r["layers"]}
    assert sorted(layers) == ["1", "3"]
    assert layers["1"]["family"] == "batch" and layers["1"]["batch_dependent"] is True
    assert layers["3"]["family"] == "group" and layers["3"]["batch_dependent"] is False
    assert layers["1"]["input_shape"] == [4, 4, 6, 6]
    problems = " ".join(w["problem"] for w in r["warnings"])
    assert "training mode" in problems                    # a fresh model is in train mode
    text = _ok(_normlab(tmp_path, "inspect", "model.py:build", "--input-shape", "4,3,8,8", "--eval")).stdout
    assert "eval mode" in text and "training mode" not in text


# --- bad runs ------------------------------------------------------------------------------------

def _main(argv) -> int:
    """``cli.main``'s exit status, as the process would end: SystemExit(message) is status 1
    with the message on stderr (Python prints it)."""
    try:
        return cli.main(argv)
    except SystemExit as e:
        if isinstance(e.code, str):
            sys.stderr.write(e.code + "\n")
            return 1
        return e.code


def _bad(argv, status, says, capsys, untouched=()):
    got = _main(argv)
    captured = capsys.readouterr()
    assert got == status, captured.err
    assert captured.out == ""
    for s in says:
        assert s in captured.err, (s, captured.err)
    for path in untouched:
        assert not Path(path).exists(), path


@pytest.mark.parametrize("argv, says", [
    (["nope"], ["invalid choice: 'nope'", "'demo'", "'bench'", "'docs'"]),
    (["demo", "nope"], ["usage: normlab demo", "invalid choice: 'nope'", "'layernorm'", "'shapes'"]),
    (["demo", "shapes", "--sample", "99"], ["usage: normlab demo shapes", "--sample", "0..31", "got 99"]),
    (["demo", "shapes", "--seed", "x"], ["--seed", "invalid int value: 'x'"]),
    (["experiment"], ["usage: normlab experiment", "required: TOPIC"]),
    (["experiment", "nope"], ["invalid choice: 'nope'", "'stability'", "'ddp'"]),
    (["figures"], ["usage: normlab figures", "required: --out"]),
    (["docs"], ["usage: normlab docs", "required: TOPIC"]),
    (["docs", "nope"], ["invalid choice: 'nope'", "'build'", "'serve'"]),
])
def test_bad_command_or_argument_is_named_with_the_usage(argv, says, capsys):
    _bad(argv, 2, says, capsys)


@pytest.mark.parametrize("extra, says", [
    (["--suite", "nope"], ["usage: normlab bench", "--suite", "'nope'", "'default'"]),
    (["--ops", "layernorm"], ["unknown op 'layernorm'", "'layer_norm'"]),
    (["--modes", "sideways"], ["unknown mode 'sideways'", "'forward'"]),
    (["--dtypes", "float16"], ["unknown dtype 'float16'", "'float32'", "'bfloat16'"]),
    (["--providers", "foo"], ["unknown provider 'foo'", "'torch'"]),
    (["--sizes", "4xq"], ["expected a shape like 4096x1024, got '4xq'"]),
    (["--threads", "0"], ["thread counts >= 1, got [0]"]),
    (["--compile-backend", "nosuch"], ["normlab bench: unknown --compile-backend 'nosuch'", "inductor", "aot_eager"]),
    (["--repeats", "x"], ["--repeats", "invalid int value: 'x'"]),
    (["--suite", "chapters", "--sizes", "4x6"], ["--suite chapters", "--sizes is not used by this suite"]),
    (["--suite", "blocks", "--providers", "torch"], ["--suite blocks", "--providers is not used by this suite"]),
])
def test_bench_bad_option_is_named_before_any_run(extra, says, tmp_path, capsys):
    out = tmp_path / "bench"
    _bad(["bench", *extra, "--out", str(out)], 2, says, capsys, untouched=[out])


@pytest.mark.parametrize("make, extra, says", [
    pytest.param("file", [], ["--out", "is not a folder"], id="out-is-a-file"),
    pytest.param("under_file", [], ["--out", "file"], id="out-under-a-file"),
    pytest.param(None, ["--repeats", "0"], ["--repeats", "got 0"], id="repeats-0"),
    pytest.param(None, ["--warmup", "-1"], ["--warmup", "got -1"], id="warmup-negative"),
])
def test_bench_bad_out_or_count_is_one_line(make, extra, says, tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("x")
    out = {"file": f, "under_file": f / "sub", None: tmp_path / "bench"}[make]
    p = _normlab(tmp_path, "bench", "--ops", "rms_norm", "--sizes", "4x6", "--modes", "forward", "--providers",
                 "torch", "--dtypes", "float32", "--threads", "1", "--out", str(out), *extra, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith("normlab bench") or p.stderr.startswith("usage: normlab bench"), p.stderr
    for s in says:
        assert s in p.stderr, (s, p.stderr)
    assert f.read_text() == "x"


@pytest.mark.parametrize("suite", ["default", "chapters", "blocks"])
@pytest.mark.parametrize("extra, says", [
    (["--repeats", "0"], ["--repeats", "got 0"]),
    (["--warmup", "-1"], ["--warmup", "got -1"]),
    (["--out", "FILE"], ["--out", "exists and is not a folder"]),
])
def test_bench_every_suite_checks_out_and_counts_before_any_run(suite, extra, says, tmp_path, capsys):
    f = tmp_path / "a.txt"
    f.write_text("x")
    out = tmp_path / "bench"
    argv = ["bench", "--suite", suite, "--threads", "1", "--out", str(out), *extra]
    _bad([str(f) if a == "FILE" else a for a in argv], 2, ["normlab bench", *says], capsys, untouched=[out])
    assert f.read_text() == "x"


@pytest.mark.parametrize("extra, says", [
    (["--nproc", "0"], ["nproc: expected between 2 and 64, got 0"]),
    (["--batch", "x"], ["batch: expected a whole number, got 'x'"]),
    (["--steps", "-3"], ["steps: expected >= 4, got -3"]),
    (["--lr", "nan"], ["--lr", "expected finite numbers, got nan"]),
    (["--lr", "-1"], ["--lr", "expected each > 0, got -1"]),
    (["--seed", "1.5"], ["--seed", "'1.5'"]),
    pytest.param(["--timeout", "0"], ["timeout", "got 0"], id="timeout-0"),
    pytest.param(["--fail-rank", "5"], ["fail-rank", "between 0 and 1", "got 5"], id="fail-rank-5"),
    pytest.param(["--fail-rank", "3", "--nproc", "3"], ["fail-rank", "between 0 and 2", "got 3"], id="fail-rank-3-of-3"),
    pytest.param(["--fail-rank", "-1"], ["fail-rank", "got -1"], id="fail-rank-negative"),
    pytest.param(["--timeout", "nan"], ["timeout", "got nan"], id="timeout-nan"),
])
def test_experiment_ddp_bad_option_is_one_line_before_any_rank_starts(extra, says, tmp_path, capsys):
    store = tmp_path / "runs.sqlite"
    _bad(["experiment", "ddp", *extra, "--store", str(store)], 2, says + ["normlab experiment ddp"], capsys,
         untouched=[store])


def test_inspect_bad_target_says_what_was_wrong(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.py").write_text(MODEL)
    shape = ["--input-shape", "4,3,8,8"]
    _bad(["inspect", *shape], 2, ["usage: normlab inspect", "required: MODULE:FACTORY"], capsys)
    _bad(["inspect", "no_such_module_here:build", *shape], 1, ["normlab inspect", "cannot import",
                                                               "No module named 'no_such_module_here'"], capsys)
    _bad(["inspect", "model.py:nope", *shape], 1, ["normlab inspect", "'model.py' has no attribute 'nope'"], capsys)
    _bad(["inspect", "model.py:build", *shape, "--seed", "x"], 2, ["--seed", "invalid int value: 'x'"], capsys)


def test_inspect_missing_file_says_it_does_not_exist(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _main(["inspect", "nofile.py:build", "--input-shape", "4,3,8,8"]) == 1  # as the other bad targets
    err = capsys.readouterr().err.lower()
    assert "nofile.py" in err and any(s in err for s in ("no such file", "not found", "does not exist"))


def test_figures_store_that_is_a_folder_is_refused_before_drawing(tmp_path, capsys):
    out = tmp_path / "figs"
    _bad(["figures", "--out", str(out), "--store", str(tmp_path)], 2,
         ["normlab figures", f"--store {tmp_path} exists and is not a file"], capsys, untouched=[out])


@pytest.mark.parametrize("topic", ["build", "serve"])
def test_docs_without_a_config_file_says_where_it_looked(topic, tmp_path, capsys):
    config = tmp_path / "none.yml"
    got = _main(["docs", topic, "--config-file", str(config)])
    err = capsys.readouterr().err
    assert got == 2, err
    assert err.startswith("normlab docs:") and "Traceback" not in err
    try:
        import mkdocs  # noqa: F401
    except ImportError:
        assert "not installed" in err and "docs" in err
    else:
        assert str(config) in err and "--config-file" in err


def test_a_bad_run_in_a_real_process_has_no_traceback(tmp_path):
    """The in-process checks above, once through the real entry point: status and stderr as a user sees them."""
    p = _normlab(tmp_path, "bench", "--ops", "layernorm", "--out", str(tmp_path / "b"), timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("normlab bench: unknown op 'layernorm'") and "Traceback" not in p.stderr
    p = _normlab(tmp_path, "inspect", "no_such_module_here:build", "--input-shape", "2,3", timeout=120)
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.startswith("normlab inspect: cannot import") and "Traceback" not in p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == []


# --- every command has both --------------------------------------------------------------------

HERE = "tests/cli/test_commands.py"
GOOD = {
    "demo layernorm": "tests/demos/test_source.py::test_demo_points_to_the_source_page",
    "demo batchnorm": "tests/demos/test_lang.py::test_cli_lang",
    "demo shapes": "tests/demos/test_source.py::test_demo_points_to_the_source_page",
    "compare": "tests/demos/test_lang.py::test_compare_cli_lang",
    "bench": f"{HERE}::test_bench_one_op_one_shape_writes_what_it_prints",
    "inspect": f"{HERE}::test_inspect_a_model_from_a_py_file",
    "experiment stability":
        "tests/experiments/test_store.py::test_sweep_killed_then_resumed_loses_and_duplicates_nothing",
    "experiment batch-size": f"{HERE}::test_experiment_batch_size_then_report_on_its_store",
    "experiment train-eval": f"{HERE}::test_experiment_train_eval_one_seed",
    # the command's ranks and timing rounds take over 30 s here; ddp.run with the session's spawned group instead
    "experiment ddp": "tests/experiments/test_ddp.py::test_sync_batch_norm_tracks_the_single_process_run_and_is_stored",
    "report": f"{HERE}::test_experiment_batch_size_then_report_on_its_store",
    "figures": "tests/figures/test_figures.py::test_command_writes_the_pngs_it_names",
    "docs build": "tests/docs/test_site.py::test_every_section_is_built",
    # a server that runs until stopped: its start-up checks are its bad runs
    "docs serve": None,
}
BAD = {
    "demo layernorm": "tests/demos/test_lang.py::test_cli_lang",
    "demo batchnorm": "tests/demos/test_lang.py::test_cli_lang",
    "demo shapes": f"{HERE}::test_bad_command_or_argument_is_named_with_the_usage",
    "compare": "tests/cli/test_parsing.py::test_unknown_or_abbreviated_flag",
    "bench": f"{HERE}::test_bench_bad_option_is_named_before_any_run",
    "inspect": f"{HERE}::test_inspect_bad_target_says_what_was_wrong",
    "experiment stability": "tests/experiments/test_args.py::test_bad_input_is_one_clear_line",
    "experiment batch-size": "tests/experiments/test_args.py::test_bad_input_is_one_clear_line",
    "experiment train-eval": "tests/experiments/test_args.py::test_bad_input_is_one_clear_line",
    "experiment ddp": f"{HERE}::test_experiment_ddp_bad_option_is_one_line_before_any_rank_starts",
    "report": "tests/experiments/test_report_output.py::test_bad_out_is_one_line",
    "figures": f"{HERE}::test_figures_store_that_is_a_folder_is_refused_before_drawing",
    "docs build": f"{HERE}::test_docs_without_a_config_file_says_where_it_looked",
    "docs serve": f"{HERE}::test_docs_without_a_config_file_says_where_it_looked",
}


def _leaves():
    for name, entry in cli.COMMANDS.items():
        if isinstance(entry, cli.Group):
            yield from (f"{name} {topic}" for topic in entry.topics)
        else:
            yield name


def test_every_command_has_a_good_and_a_bad_run():
    leaves = sorted(_leaves())
    assert sorted(GOOD) == leaves and sorted(BAD) == leaves, "a new command needs a good and a bad run here"
    for node in [*GOOD.values(), *BAD.values()]:
        if node is None:
            continue
        path, name = node.split("::")
        assert f"def {name}(" in (ROOT / path).read_text(), f"{node} is gone: point the table at its successor"
