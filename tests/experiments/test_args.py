"""Bad input: one clear line (what was expected, what was given, the fix), exit status 2,
before any run starts (no store is created)."""

import pytest

from normlab import cli
from normlab.experiments import arguments
from normlab.experiments import batch_size, stability


@pytest.mark.parametrize("argv, says", [
    (["stability", "--norms", "batch,weight"], ["unknown norm 'weight'", "none, batch, layer, rms, group"]),
    (["stability", "--norms", ""], ["expected a comma-separated list"]),
    (["stability", "--norms", "batch,batch"], ["each norm once"]),
    (["stability", "--lrs", "0.1,0"], ["expected each > 0", "got 0"]),
    (["stability", "--lrs", "0.1,-2"], ["expected each > 0"]),
    (["stability", "--lrs", "0.1,fast"], ["expected numbers", "'fast'"]),
    (["stability", "--lrs", "0.1,nan"], ["expected finite numbers, got nan"]),
    (["stability", "--lrs", "1e999"], ["expected finite numbers, got 1e999 (it reads as inf)"]),
    (["stability", "--lrs", "2,1"], ["ascending", "got 2,1", "write them as 1,2"]),
    (["stability", "--lrs", "1,1"], ["without repeats"]),
    (["stability", "--lrs", "1,,2"], ["expected a comma-separated list"]),
    (["stability", "--seeds", "0"], ["seeds: expected >= 1, got 0"]),
    (["stability", "--seeds", "ten"], ["seeds: expected a whole number, got 'ten'"]),
    (["batch-size", "--batch-sizes", "2,4000"], ["between 1 and the training set's size 1257, got 4000"]),
    (["batch-size", "--batch-sizes", "8,4"], ["ascending", "write them as 4,8"]),
    (["batch-size", "--batch-sizes", "2.5"], ["whole numbers"]),
    (["batch-size", "--norms", "rms"], ["unknown norm 'rms'", "batch, group, layer, none"]),
    (["train-eval", "--norms", "bn"], ["unknown norm 'bn'"]),
    (["stability", "--workers", "0"], ["workers: expected between 1 and"]),
    (["stability", "--workers", "999"], ["workers x threads <= cores"]),
    (["stability", "--threads", "999"], ["threads: expected between 1 and"]),
    (["stability", "--executor", "dask"], ["expected one of local, ray, got 'dask'"]),
])
def test_bad_input_is_one_clear_line(argv, says, tmp_path, capsys):
    store = tmp_path / "runs.sqlite"
    with pytest.raises(SystemExit) as e:
        cli.main(["experiment", *argv, "--store", str(store)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for s in says:
        assert s in err, err
    assert not store.exists()


@pytest.mark.skipif(arguments.cores() < 2, reason="needs 2 cores to exceed with 2 x 2")
def test_workers_times_threads_checked_together(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["experiment", "stability", "--workers", "2", "--threads", str(arguments.cores()),
                  "--store", str(tmp_path / "r.sqlite")])
    assert "exceeds this machine's" in capsys.readouterr().err


def test_python_api_raises_value_error_before_running(tmp_path):
    store = tmp_path / "runs.sqlite"
    with pytest.raises(ValueError, match="known norms are none, batch, layer, rms, group"):
        stability.run(norms=["batch", "bn"], store=str(store))
    with pytest.raises(ValueError, match="expected each > 0"):
        stability.run(lrs=[0.1, -1.0], store=str(store))
    with pytest.raises(ValueError, match="1257"):
        batch_size.run(batch_sizes=[2, 2000], store=str(store))
    with pytest.raises(ValueError, match="expected a comma-separated list"):
        stability.run(lrs=[], store=str(store))
    assert not store.exists()
