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
import pathlib
import subprocess
import sys

import compare_runs

HERE = pathlib.Path(__file__).resolve().parent


def load(path: pathlib.Path) -> dict[str, float]:
    rows = {}
    for line in path.read_text().splitlines():
        name, ms = line.rsplit("\t", 1)
        rows[name] = float(ms)
    return rows


def main() -> int:
    a = compare_runs.arguments(__doc__, runs=6, out="large-runs", out_help="folder for each run's output",
                               exe_hint="; give the path of a virtual environment's bin/python")

    def run(who: str, i: int, exe: str) -> int:
        res = subprocess.run([exe, str(HERE / "bench-large-rows.py")], check=False, capture_output=True, text=True)
        if res.returncode != 0:
            print(res.stderr, file=sys.stderr)
            return res.returncode
        dest = a.out / f"{who}-{i}.txt"
        tmp = dest.with_suffix(".part")
        tmp.write_text(res.stdout)
        tmp.replace(dest)  # only whole runs count
        return 0

    rc = compare_runs.alternate(a, lambda who, i: (a.out / f"{who}-{i}.txt").exists(), run)
    if rc != 0:
        return rc
    base, new = compare_runs.results(a, lambda who, i: load(a.out / f"{who}-{i}.txt"))
    print("| op, shape, layout, dtype, mode | base | new | new / base (runs) |")
    print("| --- | ---: | ---: | ---: |")
    for name in base[0]:
        mb, mn, lo, hi = compare_runs.medians([r[name] for r in base], [r[name] for r in new])
        print(f"| {name} | {mb:.2f} | {mn:.2f} | **{mn / mb:.2f}** ({lo:.2f}-{hi:.2f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
