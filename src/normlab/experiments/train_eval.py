"""``normlab experiment train-eval``: what forgetting ``model.eval()`` costs, measured.

Source: the BatchNorm chapter (``normlab.demos.SOURCES``: "model.eval() -- wajib sebelum
evaluasi"). The chapter's MLP [2, 64, 64, 64, 2] with Tanh, its norm from ``normlab.nn``,
trained with the chapter's loop (full-batch SGD, lr 0.3, 30 epochs) on the chapter's
300 make_moons points, then evaluated on 1000 fresh points (``make_moons(1000,
noise=0.30, random_state=7)``) five ways: in eval mode, and in train mode on
consecutive batches of 1, 2, 8 and all 1000 test points (each on a fresh copy of the
trained model, so no evaluation sees another's running statistics).

In train mode BatchNorm normalises every batch with that batch's own statistics: the
prediction for a point depends on which points share its batch, and a batch of one
point cannot be normalised at all (the layer raises; the table shows its message).
LayerNorm normalises each point by itself: every mode gives the same predictions.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

import normlab.nn

from .._extras import require
from ..demos._report import table
from . import arguments, summaries, sweep
from ._mlp import CHAPTER_SEED, chapter_mlp, moons, train_loop
from .store import DEFAULT_STORE, config_key

EXPERIMENT = "train-eval"
NORMS = ("batch", "layer", "rms", "group", "none")
DEFAULT_NORMS = ("batch", "layer")
LR, EPOCHS, SEEDS, N_TEST = 0.3, 30, 10, 1000
QUICK = {"norms": DEFAULT_NORMS, "seeds": 3}
BATCHES = (1, 2, 8, "full")
MODES = ("eval mode",) + tuple(f"train b={b}" for b in BATCHES)
LABEL = {"batch": "BatchNorm1d", "layer": "LayerNorm", "rms": "RMSNorm", "group": "GroupNorm(8)", "none": "no norm"}


def config(norm: str) -> dict:
    return {"norm": norm, "lr": LR, "epochs": EPOCHS, "test": f"make_moons({N_TEST}, noise=0.30, random_state=7)"}


def _predict(model: torch.nn.Module, X: torch.Tensor, batch: int | str, train: bool) -> torch.Tensor:
    model = copy.deepcopy(model)
    model.train(train)
    size = len(X) if batch == "full" else batch
    with torch.no_grad():
        return torch.cat([model(X[i:i + size]) for i in range(0, len(X), size)])


def train_eval_task(norm: str, seed: int) -> list[dict]:
    """Train one model, evaluate it in every mode; one record."""
    t0 = time.perf_counter()
    X, y = moons()
    Xt, yt = moons(N_TEST, 0.30, 7)
    model = chapter_mlp(norm, seed, normlab.nn)
    trained = train_loop(model, X, y, LR, EPOCHS)
    ref = _predict(model, Xt, "full", train=False)
    acc, errors, diff = {"eval mode": (ref.argmax(1) == yt).float().mean().item()}, {}, {"eval mode": 0.0}
    for b in BATCHES:
        mode = f"train b={b}"
        try:
            logits = _predict(model, Xt, b, train=True)
        except (ValueError, RuntimeError) as e:
            acc[mode], diff[mode], errors[mode] = None, None, f"{type(e).__name__}: {e}"
            continue
        acc[mode] = (logits.argmax(1) == yt).float().mean().item()
        diff[mode] = (logits - ref).abs().max().item()
    return [{"config": config(norm), "seed": seed, "epochs": {"train_loss": trained["train_loss"]},
             "final": {"accuracy": acc, "errors": errors, "max_logit_diff_vs_eval": diff,
                       "train_eval_acc": trained["eval_acc"]},
             "wall_s": time.perf_counter() - t0}]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--norms", type=arguments.arg(lambda s: arguments.parse_norms(s, NORMS)), default=None,
                   help=f"comma-separated norms from {','.join(NORMS)} (default {','.join(DEFAULT_NORMS)})")
    p.add_argument("--seeds", type=arguments.arg(lambda s: arguments.parse_count(s, "seeds")), default=None,
                   help=f"weight seeds {CHAPTER_SEED}, {CHAPTER_SEED + 1}, ... (default {SEEDS})")
    arguments.add_common_arguments(p, quick="BatchNorm and LayerNorm x 3 seeds (6 runs), ~10 s on 2 cores")


def run(norms=None, seeds=None, quick: bool = False, store: str = DEFAULT_STORE, workers: int | str = "auto",
        threads: int = 1, executor: str = "local", ray_address: str | None = None) -> dict:
    require("sklearn", "normlab experiment train-eval")  # before the store is opened or any work starts
    norms = arguments.parse_norms(norms if norms is not None else (QUICK["norms"] if quick else DEFAULT_NORMS), NORMS)
    n = arguments.parse_count(seeds if seeds is not None else (QUICK["seeds"] if quick else SEEDS), "seeds")
    seed_list = [CHAPTER_SEED + i for i in range(n)]
    workers, threads, executor = sweep.check_parallel(workers, threads, executor)
    with sweep.interrupt_note(str(store)), sweep.open_store(store) as st:
        done = st.done(EXPERIMENT)
        tasks = [(train_eval_task, {"norm": norm, "seed": s}, 1) for norm in norms for s in seed_list
                 if (config_key(config(norm)), s) not in done]
        skipped = len(norms) * len(seed_list) - len(tasks)
        info = sweep.run_tasks(st, EXPERIMENT, tasks, workers=workers, threads=threads,
                           executor=executor, ray_address=ray_address)
        runs = [r for r in st.runs(EXPERIMENT, [config(nm) for nm in norms]) if r["seed"] in seed_list]
    rows = []
    for norm in norms:
        rs = [r for r in runs if r["config"]["norm"] == norm]
        for mode in MODES:
            vals = [r["final"]["accuracy"][mode] for r in rs]
            errs = sorted({r["final"]["errors"][mode] for r in rs if mode in r["final"]["errors"]})
            diffs = [r["final"]["max_logit_diff_vs_eval"][mode] for r in rs]
            m, s = summaries.mean_std([v for v in vals if v is not None])
            rows.append({"norm": norm, "mode": mode, "runs": len(rs), "acc_mean": m, "acc_std": s,
                         "errors": errs, "failed": sum(v is None for v in vals),
                         "max_logit_diff": max((d for d in diffs if d is not None), default=None)})
    return summaries.finite_or_none({"store": str(store), "norms": norms, "seeds": seed_list, "rows": rows,
                             "speed": info, "skipped": skipped})


def render(r: dict) -> str:
    out = [f"Train mode vs eval mode at evaluation: the chapter's MLP (lr {LR}, {EPOCHS} epochs), "
           f"{N_TEST} held-out points, {summaries.plural(len(r['seeds']), 'seed')}",
           "  train b=B: model left in train mode, the test set fed in consecutive batches of B points"]
    rows = []
    for row in r["rows"]:
        if row["failed"]:
            diff, acc = "", f"error ({row['failed']} of {row['runs']} runs): {row['errors'][0]}"
        else:
            diff = "0" if row["max_logit_diff"] == 0 else f"{row['max_logit_diff']:.3g}"
            acc = summaries.pm(row["acc_mean"], row["acc_std"])
        rows.append([LABEL[row["norm"]], row["mode"], diff, acc])
    out += [table(rows, ["norm", "evaluated in", "max |logit - eval logit|", "test accuracy (mean ± std)"]), ""]
    by = {(x["norm"], x["mode"]): x for x in r["rows"]}
    for norm in r["norms"]:
        ev = by[(norm, "eval mode")]["acc_mean"]
        worst = [by[(norm, m)] for m in MODES[1:] if not by[(norm, m)]["failed"]]
        if ev is None or not worst:
            continue
        w = min(worst, key=lambda x: x["acc_mean"])
        out.append(f"  {LABEL[norm]}: eval mode {ev:.3f}; worst train-mode evaluation {w['mode']}: "
                   f"{w['acc_mean']:.3f} ({(w['acc_mean'] - ev) * 100:+.1f} points)")
    out += ["  " + summaries.speed_line(r["speed"], r["skipped"]), f"  store: {r['store']}"]
    return "\n".join(out)
