"""--workers and --executor ray give the runs a single process gives; only the driver writes."""

import pytest

from normlab.experiments import _common as C
from normlab.experiments import stability
from normlab.experiments.store import Store

ARGS = dict(norms="none,batch,layer", lrs="0.1,2", seeds=2)


def _finals(path):
    with Store(path) as s:
        return {(r["config"]["norm"], r["config"]["lr"], r["seed"]): (r["final"], r["epochs"])
                for r in s.runs("stability")}


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    path = tmp_path_factory.mktemp("serial") / "r.sqlite"
    stability.run(store=str(path), **ARGS)
    return _finals(path)


@pytest.mark.skipif(C.cores() < 2, reason="needs 2 cores")
def test_process_pool_gives_the_serial_runs(serial, tmp_path):
    path = tmp_path / "r.sqlite"
    r = stability.run(store=str(path), workers=2, **ARGS)
    assert r["study"]["speed"]["workers"] == 2 and r["study"]["speed"]["ran"] == 12
    assert _finals(path) == serial          # same members per task, one thread each: same bits


def test_ray_executor_gives_the_serial_runs(serial, tmp_path):
    pytest.importorskip("ray", reason="Ray is optional: pip install 'normlab[ray]'")
    path = tmp_path / "r.sqlite"
    r = stability.run(store=str(path), executor="ray", **ARGS)
    assert r["study"]["speed"]["executor"] == "ray" and r["study"]["speed"]["ran"] == 12
    assert _finals(path) == serial


def test_ray_missing_is_a_clear_error_before_any_run(tmp_path, monkeypatch, capsys):
    import sys
    from normlab import cli
    monkeypatch.setitem(sys.modules, "ray", None)            # import ray -> ImportError
    with pytest.raises(ValueError, match=r"pip install 'normlab\[ray\]'"):
        stability.run(store=str(tmp_path / "r.sqlite"), executor="ray", **ARGS)
    with pytest.raises(SystemExit):
        cli.main(["experiment", "stability", "--executor", "ray", "--store", str(tmp_path / "r.sqlite")])
    assert "Ray is not installed" in capsys.readouterr().err
    assert not (tmp_path / "r.sqlite").exists()
