"""The large-tensor table of docs/performance.md: scripts/bench-large-rows.py run alternately by
two Python interpreters (two virtual environments: the last Numba commit and the current tree),
each run a fresh process, then the medians over the runs and their ratio.

    python scripts/compare-large-rows.py --base /path/venv-numba/bin/python \\
        --new .venv/bin/python --runs 6 --out large-runs

Each run's output is kept in --out (base-<i>.txt, new-<i>.txt), so an interrupted comparison
resumes where it stopped. The table goes to standard output as Markdown: per row the base and
new medians (ms), new / base (below 1: the new one is faster) and the range of the per-run
ratios. Run it with the environment the measurement should have (for instance glibc's heap
kept: MALLOC_TRIM_THRESHOLD_=4294967296 MALLOC_MMAP_THRESHOLD_=1073741824)."""
import argparse
import pathlib
import statistics
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


def load(path: pathlib.Path) -> dict[str, float]:
    rows = {}
    for line in path.read_text().splitlines():
        name, ms = line.rsplit("\t", 1)
        rows[name] = float(ms)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="Python of the environment compared against")
    ap.add_argument("--new", required=True, help="Python of the environment measured")
    ap.add_argument("--runs", type=int, default=6, help="runs per environment, alternating (default 6)")
    ap.add_argument("--out", default="large-runs", help="folder for each run's output (default large-runs)")
    a = ap.parse_args()
    if a.runs < 1:
        ap.error(f"--runs: expected at least 1 run, got {a.runs}")
    for flag, exe in (("--base", a.base), ("--new", a.new)):
        if not pathlib.Path(exe).is_file():
            ap.error(f"{flag}: no Python interpreter at {exe!r}; give the path of a virtual environment's bin/python")
    out = pathlib.Path(a.out)
    if out.exists() and not out.is_dir():
        ap.error(f"--out: {out} is a file; give a folder (created if missing)")
    out.mkdir(parents=True, exist_ok=True)
    for i in range(1, a.runs + 1):
        for who, exe in (("base", a.base), ("new", a.new)):
            dest = out / f"{who}-{i}.txt"
            if dest.exists():
                continue  # finished in an earlier, interrupted comparison
            print(f"run {i}/{a.runs} {who}", file=sys.stderr, flush=True)
            res = subprocess.run([exe, str(HERE / "bench-large-rows.py")], check=False, capture_output=True, text=True)
            if res.returncode != 0:
                print(res.stderr, file=sys.stderr)
                return res.returncode
            tmp = dest.with_suffix(".part")
            tmp.write_text(res.stdout)
            tmp.replace(dest)  # only whole runs count
    base = [load(out / f"base-{i}.txt") for i in range(1, a.runs + 1)]
    new = [load(out / f"new-{i}.txt") for i in range(1, a.runs + 1)]
    print("| op, shape, layout, dtype, mode | base | new | new / base (runs) |")
    print("| --- | ---: | ---: | ---: |")
    for name in base[0]:
        b = [r[name] for r in base]
        n = [r[name] for r in new]
        ratios = [y / x for x, y in zip(b, n)]
        mb, mn = statistics.median(b), statistics.median(n)
        print(f"| {name} | {mb:.2f} | {mn:.2f} | **{mn / mb:.2f}** ({min(ratios):.2f}-{max(ratios):.2f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
