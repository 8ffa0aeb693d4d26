"""scripts/compare-large-rows.py: alternating runs in two environments, kept per run (an
interrupted comparison resumes), and the table of medians and ratios. The two "environments"
here are stand-in interpreters that print fixed rows, so the expected table is computed by
hand."""
import pathlib
import stat
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "compare-large-rows.py"


def _fake_python(path: pathlib.Path, rows: dict[str, list[float]], counter: pathlib.Path) -> pathlib.Path:
    """An executable that, like bench-large-rows.py, prints 'name<TAB>ms' lines: the k-th call
    prints each row's k-th value (k counted in `counter`)."""
    path.write_text(
        f"#!{sys.executable}\n"
        "import pathlib\n"
        f"c = pathlib.Path({str(counter)!r})\n"
        "k = int(c.read_text()) if c.exists() else 0\n"
        "c.write_text(str(k + 1))\n"
        f"rows = {rows!r}\n"
        "for name, values in rows.items():\n"
        "    print(f'{name}\\t{values[k]:.3f}')\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], check=False, capture_output=True, text=True)


def test_table_of_medians_and_resume(tmp_path):
    base = _fake_python(tmp_path / "base", {"op a fwd": [2.0, 4.0, 3.0], "op b fwd": [1.0, 1.0, 1.0]},
                        tmp_path / "base.count")
    new = _fake_python(tmp_path / "new", {"op a fwd": [1.0, 6.0, 3.3], "op b fwd": [0.5, 2.0, 0.9]},
                       tmp_path / "new.count")
    out = tmp_path / "runs"
    res = _run("--base", str(base), "--new", str(new), "--runs", "3", "--out", str(out))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    # op a: medians 3.0 and 3.3 -> 1.10; per-run ratios 0.5, 1.5, 1.1
    assert "| op a fwd | 3.00 | 3.30 | **1.10** (0.50-1.50) |" in lines
    # op b: medians 1.0 and 0.9 -> 0.90; per-run ratios 0.5, 2.0, 0.9
    assert "| op b fwd | 1.00 | 0.90 | **0.90** (0.50-2.00) |" in lines
    assert sorted(p.name for p in out.iterdir()) == [f"{w}-{i}.txt" for w in ("base", "new") for i in (1, 2, 3)]
    # a second call finds every run done: nothing runs again (the stand-ins would fail past 3 calls)
    again = _run("--base", str(base), "--new", str(new), "--runs", "3", "--out", str(out))
    assert again.returncode == 0 and again.stdout == res.stdout
    assert (tmp_path / "base.count").read_text() == "3"


def test_bad_arguments_are_named(tmp_path):
    res = _run("--base", str(tmp_path / "missing"), "--new", sys.executable)
    assert res.returncode == 2 and "--base" in res.stderr and "Traceback" not in res.stderr
    res = _run("--base", sys.executable, "--new", sys.executable, "--runs", "0")
    assert res.returncode == 2 and "--runs" in res.stderr
    f = tmp_path / "afile"
    f.write_text("")
    res = _run("--base", sys.executable, "--new", sys.executable, "--out", str(f))
    assert res.returncode == 2 and "--out" in res.stderr and "Traceback" not in res.stderr
