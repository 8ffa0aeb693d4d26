"""--workers and --executor ray give the runs a single process gives; only the driver writes."""

import pytest

from normlab.experiments import arguments, sweep
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
    stability.run(store=str(path), workers=1, **ARGS)
    return _finals(path)


@pytest.mark.skipif(arguments.cores() < 2, reason="needs 2 cores")
def test_process_pool_gives_the_serial_runs(serial, tmp_path):
    path = tmp_path / "r.sqlite"
    r = stability.run(store=str(path), workers=2, **ARGS)
    assert r["study"]["speed"]["workers"] == 2 and r["study"]["speed"]["ran"] == 12
    # one process trains each norm's 4 runs as one model; two workers split them in two
    # models of 2 (6 tasks): a member's numbers do not depend on its companions
    assert _finals(path) == serial


def test_tasks_split_evenly_over_workers():
    """Every missing run in exactly one task, at most MAX_MEMBERS per task, one norm per
    task, and a number of tasks that the workers share evenly."""
    class Empty:
        def done(self, experiment):
            return set()
    norms, lrs, seeds = stability.NORMS, stability.LRS, list(range(123, 133))
    for workers in (1, 2, 3, 4):
        tasks, skipped = stability.study_tasks(Empty(), norms, lrs, seeds, workers)
        runs = [(t[1]["norm"], lr, s) for t in tasks for lr, s in t[1]["members"]]
        assert sorted(runs) == sorted((n, lr, s) for n in norms for lr in lrs for s in seeds) and skipped == 0
        assert all(len(t[1]["members"]) == t[2] <= stability.MAX_MEMBERS for t in tasks)
        if workers > 1:
            assert len(tasks) % workers == 0, (workers, len(tasks))


def test_workers_auto_fills_the_cores():
    assert sweep.check_parallel("auto", 1, "local")[0] == arguments.cores()
    assert sweep.check_parallel("auto", arguments.cores(), "local")[0] == 1


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_pool_workers_end_with_a_killed_parent(tmp_path):
    """kill -9 of a sweep must not leave its workers running (or waiting) for nobody."""
    import os
    import signal
    import subprocess
    import sys
    import time
    script = ("from normlab.experiments import sweep\n"
              "import os, sys, time\n"
              "pool = sweep.start_pool(2, 1)\n"
              "print(' '.join(str(p) for p in pool._processes), flush=True)\n"
              "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2 and all(os.path.exists(f"/proc/{p}") for p in pids)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 20
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in pids if _running(p)]
    assert not alive, f"workers {alive} outlived their killed parent"


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


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


def _record_task(seed: int) -> list[dict]:
    return [{"config": {"norm": "none", "lr": 0.1, "epochs": 1}, "seed": seed, "epochs": {"train_loss": [1.0]},
             "final": {"train_loss": 1.0}, "wall_s": 0.0}]


@pytest.mark.skipif(arguments.cores() < 2, reason="needs 2 cores")
def test_forked_workers_and_one_process_store_the_same_records(tmp_path):
    tasks = [(_record_task, {"seed": s}, 1) for s in range(4)]
    seeds = []
    for name, workers in (("a", 2), ("b", 1)):
        with Store(tmp_path / f"{name}.sqlite") as st:
            sweep.run_tasks(st, "pool-test", tasks, workers=workers, threads=1)
            seeds.append(sorted(r["seed"] for r in st.runs("pool-test")))
    assert seeds == [[0, 1, 2, 3], [0, 1, 2, 3]]
