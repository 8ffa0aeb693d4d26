"""``normlab experiment stability``: does a norm let the chapter's MLP survive a large learning rate?

Source: the BatchNorm chapter's MLP script (see ``normlab.demos.SOURCES`` and the
documentation's "The source chapters" page).

1. The chapter's table, recomputed: seed 123, lr = 2.0, 30 epochs, without a norm and
   with ``normlab.nn.BatchNorm1d`` before each Tanh, trained with the chapter's own loop;
   the training loss at epochs 1, 5, 10, ..., 30, then eval loss and accuracy, beside the
   numbers the chapter prints, and which of them match to the printed digits.
2. The study: every norm in {none, batch, layer, rms, group, dyt} at every lr in
   {0.1, 0.3, 1, 2, 4}, with 10 weight seeds (123, 124, ...), all members of one norm
   trained as one batched model (``_mlp.BatchedMLP``). Per (norm, lr): mean ± std of the
   final eval accuracy, and the fraction of runs that failed to train
   (:data:`_mlp.FAILURE_RULE`: a NaN/inf loss, final eval accuracy no better than chance,
   or the last training loss not below the first), applied to the stored curves, so a
   store written under an older rule is counted the same way. Every run, with its loss
   curve, goes to the store; a re-run trains only what is missing. The chapter's no-norm
   accuracy is placed among normlab's no-norm runs at lr 2 (its percentile): that run is
   chaotic, so the spread over seeds is the honest comparison, not one run's digits.
   ``--quick`` trains the first five (not DyT: the quick study CI and the site build run
   stays as it was; ``--quick --norms ...,dyt`` adds it).
3. ``--compare-loop``: the same runs timed one after another with the chapter's plain
   ``torch.nn`` loop (as the chapter runs it, and again with subnormals flushed to zero,
   so that the gain of batching shows apart from that of flushing), beside the batched
   model in this process and (``--workers N``) in N worker processes, in runs/s.

Evaluation follows the chapter: eval mode on the same 300 points it trains on.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import normlab.nn

from .._extras import require
from ..demos._report import table
from . import arguments, summaries, sweep
from ..demos import source_label
from ._mlp import (CHAPTER_SEED, EPOCHS, FAILURE_RULE, NORMS, chapter_mlp, diverged, failure, moons, run_failure,
                   subnormals_flushed, train_batched, train_loop)
from .store import DEFAULT_STORE, Store, config_key

EXPERIMENT = "stability"
CHAPTER_EXPERIMENT = "stability-chapter"
CHAPTER = source_label("batchnorm", "its MLP experiment")
CHAPTER_LR = 2.0
LRS = (0.1, 0.3, 1.0, 2.0, 4.0)
SEEDS = 10
QUICK = {"norms": NORMS[:5], "lrs": (0.1, 1.0, 2.0, 4.0), "seeds": 4}
MAX_MEMBERS = 50      # runs trained together in one batched model
PRINTED_EPOCHS = (1, 5, 10, 15, 20, 25, 30)
# What the chapter prints (loss: 4 decimals, accuracy: 3).
CHAPTER_PRINTED = {
    "none": {"train_loss": (0.6528, 14.2757, 42.3640, 37.2810, 2.1132, 6.2559, 2.2935),
             "eval_loss": 9.3547, "eval_acc": 0.520},
    "batch": {"train_loss": (0.5619, 12.9122, 0.6048, 0.4482, 0.3440, 0.4392, 0.3101),
              "eval_loss": 0.3081, "eval_acc": 0.877},
}
LABEL = {"none": "no norm", "batch": "BatchNorm1d", "layer": "LayerNorm", "rms": "RMSNorm",
         "group": "GroupNorm(8)", "dyt": "DyT"}


def config(norm: str, lr: float, epochs: int = EPOCHS) -> dict:
    """A study run's configuration; its members train with subnormals flushed to zero."""
    return {"norm": norm, "lr": float(lr), "epochs": epochs, "subnormals": "flushed"}


def _chapter_config(norm: str) -> dict:
    """The chapter's run: its own loop, subnormals as the machine gives them (not flushed)."""
    return {"norm": norm, "lr": CHAPTER_LR, "epochs": EPOCHS, "loop": "chapter"}


# --------------------------------------------------------------------------
# Work done in a worker process (module level: picklable)
# --------------------------------------------------------------------------

def chapter_task(norm: str) -> list[dict]:
    """The chapter's run: seed 123, lr 2.0, its own loop, normlab's norm layer."""
    X, y = moons()
    t0 = time.perf_counter()
    r = train_loop(chapter_mlp(norm, CHAPTER_SEED, normlab.nn), X, y, CHAPTER_LR)
    final = {"train_loss": r["train_loss"][-1], "eval_loss": r["eval_loss"], "eval_acc": r["eval_acc"],
             "diverged": diverged(r["train_loss"], r["eval_loss"]),
             "failure": failure(r["train_loss"], r["eval_loss"], r["eval_acc"])}
    return [{"config": _chapter_config(norm), "seed": CHAPTER_SEED, "epochs": {"train_loss": r["train_loss"]},
             "final": final, "wall_s": time.perf_counter() - t0}]


def study_task(norm: str, members: list[tuple[float, int]], epochs: int = EPOCHS) -> list[dict]:
    """Train ``members`` ((lr, seed) pairs) of one norm as one batched model."""
    X, y = moons()
    out = []
    for (lr, seed), r in zip(members, train_batched(norm, members, X, y, epochs)):
        final = {k: r[k] for k in ("eval_loss", "eval_acc", "diverged", "failure")}
        final["train_loss"] = r["train_loss"][-1]
        out.append({"config": config(norm, lr, epochs), "seed": seed, "epochs": {"train_loss": r["train_loss"]},
                    "final": final, "wall_s": r["wall_s"]})
    return out


# --------------------------------------------------------------------------
# The study, the chapter table, the loop comparison
# --------------------------------------------------------------------------

def study_tasks(store: Store, norms, lrs, seeds: list[int], workers: int = 1) -> tuple[list, int]:
    """Tasks for the runs not in the store, and how many runs were already stored.

    A task trains some of one norm's missing runs as one batched model: at most
    MAX_MEMBERS, and, with ``workers`` > 1, each norm's runs split into as many equal
    parts as make the number of tasks a multiple of ``workers`` (so that the workers
    finish together)."""
    done = store.done(EXPERIMENT)
    todos, skipped = [], 0
    for norm in norms:
        todo = []
        for lr in lrs:
            key = config_key(config(norm, lr))
            for s in seeds:
                if (key, s) in done:
                    skipped += 1
                else:
                    todo.append((lr, s))
        if todo:
            todos.append((norm, todo))
    tasks = []
    for norm, todo in todos:
        parts = -(-len(todo) // MAX_MEMBERS)
        while workers > 1 and (len(todos) * parts) % workers and parts < len(todo):
            parts += 1
        size = -(-len(todo) // parts)
        for i in range(0, len(todo), size):
            chunk = todo[i:i + size]
            tasks.append((study_task, {"norm": norm, "members": chunk}, len(chunk)))
    return tasks, skipped


def summarize(runs: list[dict], norms, lrs) -> list[dict]:
    """A cell per (norm, lr), every number from the stored runs."""
    cells = []
    for norm in norms:
        for lr in lrs:
            rs = [r for r in runs if r["config"]["norm"] == norm and r["config"]["lr"] == float(lr)]
            acc_mean, acc_std = summaries.mean_std([r["final"]["eval_acc"] for r in rs])
            why = [run_failure(r) for r in rs]
            cells.append({"norm": norm, "lr": float(lr), "runs": len(rs), "acc_mean": acc_mean, "acc_std": acc_std,
                          "failed": sum(w is not None for w in why) / len(rs) if rs else None,
                          "failures": {k: why.count(k) for k in ("non-finite", "chance", "loss")},
                          # the old rule (NaN/inf, or last loss > 10x first), for the figures that draw it
                          "diverged": sum(r["final"]["diverged"] for r in rs) / len(rs) if rs else None,
                          "seeds": sorted(r["seed"] for r in rs)})
    return cells


def percentile_among(value: float, values, ndigits: int = 3) -> dict | None:
    """Where ``value`` (printed with ``ndigits`` decimals) falls among ``values``: the mid-rank
    percentile (values below, plus half of those equal at that rounding), with the range."""
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    below = sum(round(x, ndigits) < value for x in v)
    equal = sum(round(x, ndigits) == value for x in v)
    return {"value": value, "n": len(v), "below": below, "equal": equal,
            "percentile": 100.0 * (below + 0.5 * equal) / len(v),
            "min": v[0], "median": statistics.median(v), "max": v[-1]}


def chapter_spread(store: Store, norm: str = "none") -> dict | None:
    """The chapter's eval accuracy for ``norm`` among every stored study run of that norm
    at the chapter's lr 2.0 (every seed the store holds)."""
    runs = store.runs(EXPERIMENT, [config(norm, CHAPTER_LR)])
    return percentile_among(CHAPTER_PRINTED[norm]["eval_acc"], [r["final"]["eval_acc"] for r in runs])


def spread_line(sp: dict | None, norm: str = "none") -> str:
    """One sentence: the chapter's number among normlab's runs."""
    if sp is None:
        return (f"no study runs of {LABEL[norm]} at lr {CHAPTER_LR:g} in the store to compare the chapter's "
                f"accuracy with (run the study with --norms {norm} --lrs 2)")
    return (f"the chapter's {LABEL[norm]} accuracy {sp['value']:.3f} lies at percentile {sp['percentile']:.0f} of "
            f"normlab's {summaries.plural(sp['n'], 'run')} of {LABEL[norm]} at lr {CHAPTER_LR:g} "
            f"({sp['below']} below it, {sp['equal']} equal; min {sp['min']:.3f}, median {sp['median']:.3f}, "
            f"max {sp['max']:.3f})")


def chapter_rows(store: Store) -> dict:
    """The chapter's two runs from the store, beside what the chapter prints."""
    out = {}
    for norm, printed in CHAPTER_PRINTED.items():
        (r,) = store.runs(CHAPTER_EXPERIMENT, [_chapter_config(norm)])
        ours = [r["epochs"]["train_loss"][e - 1] for e in PRINTED_EPOCHS]
        rows = [(f"epoch {e:2d} loss", p, v, 4) for e, p, v in zip(PRINTED_EPOCHS, printed["train_loss"], ours)]
        rows.append(("eval loss", printed["eval_loss"], r["final"]["eval_loss"], 4))
        rows.append(("eval accuracy", printed["eval_acc"], r["final"]["eval_acc"], 3))
        # a match: our number rounded as the chapter prints it is the printed number
        out[norm] = [{"what": w, "chapter": p, "normlab": v, "match": round(v, nd) == p} for w, p, v, nd in rows]
    return out


class _EmptyStore:
    """A store with no runs (to plan the tasks of a whole study)."""

    def done(self, experiment: str) -> set:
        return set()


def time_against_loop(norms, lrs, seeds: list[int], epochs: int = EPOCHS, repeats: int = 2, threads: int = 1,
                      workers: int = 1) -> dict:
    """Wall time of the same runs, best of ``repeats``: the chapter's plain torch.nn loop,
    one run after another, as the chapter runs it and with subnormals flushed; the batched
    model in this process; and, with ``workers`` > 1, the batched model in a pool of
    processes (its start included). The first three alternate per norm, so a
    drifting background load hits them alike."""
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    with sweep.torch_threads(threads):
        X, y = moons()
        members = [(lr, s) for lr in lrs for s in seeds]
        chunks = [(norm, members[i:i + MAX_MEMBERS]) for norm in norms for i in range(0, len(members), MAX_MEMBERS)]
        n = len(norms) * len(members)
        loop_s = flushed_s = batched_s = 0.0

        def loop(norm, flush):
            t0 = time.perf_counter()
            with subnormals_flushed(flush):
                for lr, s in members:
                    train_loop(chapter_mlp(norm, s), X, y, lr, epochs)
            return time.perf_counter() - t0

        for norm in norms:
            train_loop(chapter_mlp(norm, seeds[0]), X, y, lrs[0], epochs)          # first calls: lazy init
            train_batched(norm, members[:2], X, y, epochs)
            best_loop = best_flushed = best_batched = float("inf")
            for _ in range(repeats):
                best_loop = min(best_loop, loop(norm, False))
                best_flushed = min(best_flushed, loop(norm, True))
                t0 = time.perf_counter()
                for nm, chunk in chunks:
                    if nm == norm:
                        train_batched(norm, chunk, X, y, epochs)
                best_batched = min(best_batched, time.perf_counter() - t0)
            loop_s, flushed_s, batched_s = loop_s + best_loop, flushed_s + best_flushed, batched_s + best_batched
    out = {"runs": n, "epochs": epochs, "threads": threads, "repeats": repeats, "loop_s": loop_s,
           "loop_runs_per_s": n / loop_s, "loop_flushed_s": flushed_s, "loop_flushed_runs_per_s": n / flushed_s, "batched_s": batched_s, "batched_runs_per_s": n / batched_s,
           "ratio": loop_s / batched_s, "workers": workers, "pool_s": None, "pool_runs_per_s": None,
           "pool_ratio": None}
    if workers > 1:
        # the pool's start is part of its time; the same tasks as the command makes
        parts = [(c["norm"], c["members"]) for _, c, _ in study_tasks(_EmptyStore(), norms, lrs, seeds, workers)[0]]
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            pool = sweep.start_pool(workers, threads)
            try:
                list(pool.map(study_task, [p[0] for p in parts], [p[1] for p in parts]))
            finally:
                pool.shutdown()
            best = min(best, time.perf_counter() - t0)
        out.update(pool_s=best, pool_runs_per_s=n / best, pool_ratio=loop_s / best)
    out["loadavg"] = [load0, os.getloadavg()[0] if hasattr(os, "getloadavg") else None]
    return out


# --------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------

def _check(norms, lrs, seeds, quick: bool):
    norms = arguments.parse_norms(norms if norms is not None else (QUICK["norms"] if quick else NORMS), NORMS)
    lrs = arguments.parse_lrs(lrs if lrs is not None else (QUICK["lrs"] if quick else LRS))
    n = arguments.parse_count(seeds if seeds is not None else (QUICK["seeds"] if quick else SEEDS), "seeds")
    return norms, lrs, [CHAPTER_SEED + i for i in range(n)]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--norms", type=arguments.arg(lambda s: arguments.parse_norms(s, NORMS)), default=None,
                   help=f"comma-separated norms (default {','.join(NORMS)})")
    p.add_argument("--lrs", type=arguments.arg(arguments.parse_lrs), default=None,
                   help=f"comma-separated learning rates, ascending (default {','.join(f'{v:g}' for v in LRS)})")
    p.add_argument("--seeds", type=arguments.arg(lambda s: arguments.parse_count(s, "seeds")), default=None,
                   help=f"weight seeds per configuration: {CHAPTER_SEED}, {CHAPTER_SEED + 1}, ... (default {SEEDS})")
    p.add_argument("--compare-loop", action="store_true",
                   help="also time the same runs with the chapter's plain torch.nn loop, one after another")
    arguments.add_common_arguments(p, quick="5 norms x lr 0.1, 1, 2, 4 x 4 seeds, ~9 s on 2 cores")


def run(norms=None, lrs=None, seeds=None, quick: bool = False, store: str = DEFAULT_STORE, workers: int | str = "auto",
        threads: int = 1, executor: str = "local", ray_address: str | None = None, compare_loop: bool = False) -> dict:
    """The chapter table, then the study; every number read back from the store."""
    require("sklearn", "normlab experiment stability")  # before the store is opened or any work starts
    norms, lrs, seed_list = _check(norms, lrs, seeds, quick)
    workers, threads, executor = sweep.check_parallel(workers, threads, executor)
    with sweep.interrupt_note(str(store)), sweep.open_store(store) as st:
        done = st.done(CHAPTER_EXPERIMENT)
        todo = [n for n in CHAPTER_PRINTED if (config_key(_chapter_config(n)), CHAPTER_SEED) not in done]
        sweep.run_tasks(st, CHAPTER_EXPERIMENT, [(chapter_task, {"norm": n}, 1) for n in todo], threads=threads,
                    label="chapter runs")
        chapter = chapter_rows(st)
        tasks, skipped = study_tasks(st, norms, lrs, seed_list, workers if executor == "local" else 1)
        info = sweep.run_tasks(st, EXPERIMENT, tasks, workers=workers, threads=threads,
                           executor=executor, ray_address=ray_address)
        runs = st.runs(EXPERIMENT, [config(n, lr) for n in norms for lr in lrs])
        runs = [r for r in runs if r["seed"] in seed_list]
        spread = chapter_spread(st)
    timing = time_against_loop(norms, lrs, seed_list, threads=threads, workers=workers) if compare_loop else None
    result = {"chapter_source": CHAPTER, "store": str(store), "chapter": chapter, "chapter_spread": spread,
              "failure_rule": FAILURE_RULE,
              "study": {"norms": norms, "lrs": lrs, "seeds": seed_list, "epochs": EPOCHS,
                        "cells": summarize(runs, norms, lrs), "speed": info, "skipped": skipped},
              "compare_loop": timing}
    return summaries.finite_or_none(result)


def _verdict(norm: str, rows: list[dict], spread: dict | None = None) -> str:
    n_match = sum(r["match"] for r in rows)
    acc = rows[-1]
    head = f"{LABEL[norm]}: {n_match} of {len(rows)} printed numbers are the same to the printed digits"
    if norm == "none":
        # a chaotic run: one run's digits prove little; where the chapter's number falls does
        return (head + f". At lr {CHAPTER_LR:g} this run is chaotic (float rounding alone moves it), so the"
                " comparison that counts is with many seeds: " + spread_line(spread, norm) + ".")
    if n_match == len(rows):
        return head + "."
    worst = max(abs(r["normlab"] - r["chapter"]) for r in rows if r["normlab"] is not None)
    return (head + f"; the largest difference is {worst:.4g}, eval accuracy {acc['normlab']:.3f} vs the chapter's "
            f"{acc['chapter']:.3f}. Later epochs drift by float rounding after the epoch-5 spike.")


def _failed_text(c: dict) -> str:
    why = ", ".join(f"{n} {k}" for k, n in c["failures"].items() if n)
    return f"{c['failed']:.2f}" + (f" ({why})" if why else "")


def render(r: dict) -> str:
    out = [f"Training stability at a large learning rate  [{r['chapter_source']}]", "",
           f"1. The chapter's runs: seed {CHAPTER_SEED}, lr {CHAPTER_LR:g}, {EPOCHS} epochs, full-batch SGD on "
           "make_moons(300, noise=0.30); normlab layers in the chapter's loop"]
    rows = []
    ch = r["chapter"]
    for i, row in enumerate(ch["none"]):
        b = ch["batch"][i]
        fmt = (lambda v: "n/a" if v is None else f"{v:.3f}") if "accuracy" in row["what"] else (
            lambda v: "n/a" if v is None else f"{v:.4f}")
        rows.append([row["what"], fmt(row["chapter"]), fmt(row["normlab"]),
                     fmt(b["chapter"]), fmt(b["normlab"]), "yes" if b["match"] else "no"])
    out += [table(rows, ["", "no norm: chapter", "normlab", "BatchNorm1d: chapter", "normlab", "same digits"]), ""]
    out += ["  " + _verdict("none", ch["none"], r.get("chapter_spread")), "  " + _verdict("batch", ch["batch"]), ""]

    s = r["study"]
    seeds = s["seeds"]
    out.append(f"2. The study: {summaries.plural(len(s['norms']), 'norm')} x {summaries.plural(len(s['lrs']), 'learning rate')} x "
               f"{summaries.plural(len(seeds), 'seed')} ({seeds[0]}..{seeds[-1]}), {s['epochs']} epochs; final eval accuracy"
               " mean ± std over seeds, then the fraction of runs that failed to train")
    header = ["norm"] + [f"lr {lr:g}" for lr in s["lrs"]]
    rows, failed = [], []
    for norm in s["norms"]:
        cells = [c for c in s["cells"] if c["norm"] == norm]
        rows.append([LABEL[norm]] + [summaries.pm(c["acc_mean"], c["acc_std"]) if c["runs"] else "no runs" for c in cells])
        failed.append([LABEL[norm]] + [_failed_text(c) if c["runs"] else "no runs" for c in cells])
    out += [table(rows, header), "", table(failed, ["failed to train"] + header[1:]), "",
            "  failed to train: " + r.get("failure_rule", FAILURE_RULE) + "; in brackets, how many runs failed"
            " by each (the first that applies). Loss curves of every run are in the store (normlab report"
            " draws them).",
            "  " + summaries.speed_line(s["speed"], s["skipped"]), f"  store: {r['store']}"]
    cmp = r["compare_loop"]
    if cmp:
        rows = [["the chapter's torch.nn loop, one run after another", f"{cmp['loop_s']:.2f} s",
                 f"{cmp['loop_runs_per_s']:.1f}", "1.00x"],
                ["the same loop, subnormals flushed to zero", f"{cmp['loop_flushed_s']:.2f} s",
                 f"{cmp['loop_flushed_runs_per_s']:.1f}", f"{cmp['loop_s'] / cmp['loop_flushed_s']:.2f}x"],
                ["normlab batched model, this process", f"{cmp['batched_s']:.2f} s",
                 f"{cmp['batched_runs_per_s']:.1f}", f"{cmp['ratio']:.2f}x"]]
        if cmp["pool_s"]:
            rows.append([f"normlab batched model, {cmp['workers']} worker processes", f"{cmp['pool_s']:.2f} s",
                         f"{cmp['pool_runs_per_s']:.1f}", f"{cmp['pool_ratio']:.2f}x"])
        load = cmp.get("loadavg") or [None, None]
        out += ["", f"3. Speed: the same {cmp['runs']} runs of {cmp['epochs']} epochs, {cmp['threads']} torch "
                f"thread{'s' if cmp['threads'] != 1 else ''} per process, best of {cmp['repeats']} (wall time)",
                table(rows, ["", "time", "runs/s", "vs loop"]),
                "  The batched model flushes subnormals to zero (see `normlab.experiments._mlp`): diverging runs"
                " otherwise spend most of their time on them."]
        if load[0] is not None:
            out.append(f"  load average before/after: {load[0]:.2f} / {load[1]:.2f} (other processes share these cores)")
    return "\n".join(out)
