"""`normlab bench --suite chapters --quick` run alternately by two Python interpreters (two
environments, or two trees: a wrapper script that sets PYTHONPATH is an interpreter too), each run
a fresh process, then per row the medians over the runs of normlab's time and their ratio.

    python scripts/compare-chapters.py --base /path/venv-a/bin/python --new .venv/bin/python --runs 4

Each run's files are kept in --out (base-<i>/, new-<i>/: chapters.csv), so an interrupted
comparison resumes. The table goes to standard output as Markdown: per row the base and new
medians of normlab's time (us; the loops: ms per run), new / base (below 1: the new one is faster)
with the range of the per-run ratios, and the same ratio against torch's time measured beside it
in the same run (new's torch / normlab over base's: the load of the moment divided out)."""

import csv
import pathlib
import statistics
import subprocess
import sys

import compare_runs


def load(path: pathlib.Path) -> dict:
    rows = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r["status"] != "ok":
                continue
            key = f"{r['layer']} {r['shape']} {r['dtype']} t{r['threads']} {r['mode']}".strip()
            if r["normlab_runs_per_s"]:  # the training loops: ms per run
                rows[key] = (1e3 / float(r["normlab_runs_per_s"]), 1e3 / float(r["torch_runs_per_s"]))
            else:
                rows[key] = (float(r["normlab_us"]), float(r["torch_us"]))
    return rows


def main() -> int:
    a = compare_runs.arguments(__doc__, runs=4, out="chapters-runs", out_help="folder for each run's files")

    def run(who: str, i: int, exe: str) -> int:
        dest = a.out / f"{who}-{i}"
        res = subprocess.run([exe, "-m", "normlab.bench", "--suite", "chapters", "--quick", "--out", str(dest)],
                             check=False, capture_output=True, text=True)
        if res.returncode != 0:
            print(res.stdout[-3000:], res.stderr[-3000:], file=sys.stderr)
        else:
            (dest / "done").write_text("")
        return res.returncode

    rc = compare_runs.alternate(a, lambda who, i: (a.out / f"{who}-{i}" / "done").exists(), run)
    if rc != 0:
        return rc
    base, new = compare_runs.results(a, lambda who, i: load(a.out / f"{who}-{i}" / "chapters.csv"))
    print("| row | base | new | new / base (runs) | vs torch beside it |")
    print("| --- | ---: | ---: | ---: | ---: |")
    all_ratios, all_rel = [], []
    for name in base[0]:
        if not all(name in r for r in base + new):
            continue
        mb, mn, lo, hi = compare_runs.medians([r[name][0] for r in base], [r[name][0] for r in new])
        rel = statistics.median(r[name][0] / r[name][1] for r in new) / statistics.median(
            r[name][0] / r[name][1] for r in base)
        all_ratios.append(mn / mb)
        all_rel.append(rel)
        print(f"| {name} | {mb:.1f} | {mn:.1f} | **{mn / mb:.2f}** ({lo:.2f}-{hi:.2f}) | {rel:.2f} |")
    print(f"\n{len(all_ratios)} rows: new / base median {statistics.median(all_ratios):.3f} "
          f"(rows {min(all_ratios):.2f}-{max(all_ratios):.2f}); against torch beside it: median "
          f"{statistics.median(all_rel):.3f} (rows {min(all_rel):.2f}-{max(all_rel):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
