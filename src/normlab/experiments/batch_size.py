"""``normlab experiment batch-size``: does BatchNorm fall behind GroupNorm at small batches?

Mirrors Figure 1 of Wu & He, "Group Normalization" (2018): on ImageNet, BatchNorm's
error rises sharply as the batch shrinks (10.6 points worse than GroupNorm's at batch
2) while GroupNorm's stays flat. Here, a small CNN on scikit-learn's digits (8x8
images that ship with scikit-learn):

    conv 3x3 (1 -> 16) -> norm -> ReLU -> conv 3x3 (16 -> 32) -> norm -> ReLU
    -> max-pool 2x2 -> linear (32*4*4 -> 10)

with norm in {batch: ``BatchNorm2d``, group: ``GroupNorm(4, C)``, layer: ``GroupNorm(1, C)``
(statistics over C, H, W per sample, as Wu & He define LN), none}, all ``normlab.nn``;
batch sizes {2, 4, 8, 16, 32, 64, 128}, the same number of epochs for every batch size,
SGD with momentum 0.9 and the learning rate scaled linearly with the batch size
(0.02 x B / 32, the linear scaling rule Wu & He use; 0.05 made batch 128 diverge), 3
seeds. A run's seed fixes its weights and its shuffling; the last partial batch of an
epoch is dropped (a BatchNorm batch of one sample cannot be normalised). Test accuracy
in eval mode on a held-out 30% split.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F

import normlab.nn

from .._extras import require
from ..demos._report import table
from . import arguments, summaries, sweep
from .store import DEFAULT_STORE, config_key

EXPERIMENT = "batch-size"
NORMS = ("batch", "group", "layer", "none")
BATCH_SIZES = (2, 4, 8, 16, 32, 64, 128)
SEEDS = 3
EPOCHS = 5
BASE_LR, BASE_BATCH, MOMENTUM = 0.02, 32, 0.9
QUICK = {"norms": ("batch", "group"), "batch_sizes": (8, 32, 128), "seeds": 2, "epochs": 2}
TEST_FRACTION = 0.3
PAPER = "Wu & He 2018, Figure 1: ImageNet ResNet-50 error vs batch size; at batch 2 BN is 10.6 points worse than GN"
LABEL = {"batch": "BatchNorm2d", "group": "GroupNorm(4)", "layer": "LayerNorm (GroupNorm(1))", "none": "no norm"}


def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(X_train, y_train, X_test, y_test): 1797 images scaled to [0, 1], a stratified 70/30 split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    d = load_digits()
    X = torch.tensor(d.images / 16.0, dtype=torch.float32).unsqueeze(1)      # (1797, 1, 8, 8)
    y = torch.tensor(d.target, dtype=torch.long)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=TEST_FRACTION, stratify=y, random_state=0)
    return Xtr, ytr, Xte, yte


N_TRAIN = 1797 - math.ceil(1797 * TEST_FRACTION)    # 1257: train_test_split rounds the test part up


def _norm(norm: str, channels: int) -> torch.nn.Module:
    if norm == "batch":
        return normlab.nn.BatchNorm2d(channels)
    if norm == "group":
        return normlab.nn.GroupNorm(4, channels)
    if norm == "layer":
        return normlab.nn.GroupNorm(1, channels)
    return torch.nn.Identity()


def cnn(norm: str, seed: int) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), _norm(norm, 16), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, padding=1), _norm(norm, 32), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 4 * 4, 10))


def lr_for(batch_size: int) -> float:
    return BASE_LR * batch_size / BASE_BATCH


def config(norm: str, batch_size: int, epochs: int) -> dict:
    return {"norm": norm, "batch_size": batch_size, "epochs": epochs, "lr": lr_for(batch_size),
            "momentum": MOMENTUM, "model": "cnn-16-32"}


def accuracy(model: torch.nn.Module, X: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        return (model(X).argmax(1) == y).float().mean().item()


def train_task(norm: str, batch_size: int, seed: int, epochs: int) -> list[dict]:
    """One run: a record with the per-epoch training loss and eval-mode test accuracy."""
    t0 = time.perf_counter()
    Xtr, ytr, Xte, yte = digits()
    model = cnn(norm, seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr_for(batch_size), momentum=MOMENTUM)
    gen = torch.Generator().manual_seed(seed)
    n = len(Xtr)
    losses, accs = [], []
    for _ in range(epochs):
        model.train()
        perm = torch.randperm(n, generator=gen)
        total, steps = 0.0, 0
        for i in range(0, n - batch_size + 1, batch_size):        # full batches only
            idx = perm[i:i + batch_size]
            opt.zero_grad()
            loss = F.cross_entropy(model(Xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            total, steps = total + loss.item(), steps + 1
        losses.append(total / steps)
        accs.append(accuracy(model, Xte, yte))
    return [{"config": config(norm, batch_size, epochs), "seed": seed,
             "epochs": {"train_loss": losses, "test_acc": accs},
             "final": {"test_acc": accs[-1], "train_loss": losses[-1]}, "wall_s": time.perf_counter() - t0}]


def _check(norms, batch_sizes, seeds, epochs, quick: bool):
    norms = arguments.parse_norms(norms if norms is not None else (QUICK["norms"] if quick else NORMS), NORMS)
    sizes = arguments.parse_batch_sizes(batch_sizes if batch_sizes is not None
                                else (QUICK["batch_sizes"] if quick else BATCH_SIZES), N_TRAIN)
    n = arguments.parse_count(seeds if seeds is not None else (QUICK["seeds"] if quick else SEEDS), "seeds")
    e = arguments.parse_count(epochs if epochs is not None else (QUICK["epochs"] if quick else EPOCHS), "epochs")
    return norms, sizes, list(range(n)), e


def verdict(cells: dict, sizes: list[int]) -> str:
    """Whether BatchNorm loses to GroupNorm at the smallest batch and GroupNorm stays flat."""
    if not all((n, b) in cells for n in ("batch", "group") for b in (sizes[0], sizes[-1])):
        return "Wu & He's comparison needs batch and group at the smallest and largest batch size; not run."
    small, large = sizes[0], sizes[-1]
    bn_s, gn_s = cells[("batch", small)]["mean"], cells[("group", small)]["mean"]
    bn_l, gn_l = cells[("batch", large)]["mean"], cells[("group", large)]["mean"]
    gap_s, gap_l = (gn_s - bn_s) * 100, (gn_l - bn_l) * 100
    noise = 100 * max(cells[("batch", small)]["std"], cells[("group", small)]["std"])
    gn_range = 100 * (max(cells[("group", b)]["mean"] for b in sizes if ("group", b) in cells)
                      - min(cells[("group", b)]["mean"] for b in sizes if ("group", b) in cells))
    same = gap_s > max(1.0, noise) and gap_s > gap_l + 1.0
    return (f"At batch {small}, GroupNorm - BatchNorm = {gap_s:+.1f} accuracy points (Wu & He: +10.6 at batch 2); "
            f"at batch {large}: {gap_l:+.1f}. GroupNorm's accuracy spans {gn_range:.1f} points over the batch sizes. "
            + ("Same shape as Wu & He: BatchNorm falls behind at small batches." if same else
               "Not Wu & He's shape: BatchNorm does not fall behind GroupNorm at small batches here "
               f"(seed-to-seed std up to {noise:.1f} points)."))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--norms", type=arguments.arg(lambda s: arguments.parse_norms(s, NORMS)), default=None,
                   help=f"comma-separated norms (default {','.join(NORMS)})")
    p.add_argument("--batch-sizes", type=arguments.arg(lambda s: arguments.parse_batch_sizes(s, N_TRAIN)), default=None,
                   help=f"ascending, at most {N_TRAIN} (default {','.join(map(str, BATCH_SIZES))})")
    p.add_argument("--seeds", type=arguments.arg(lambda s: arguments.parse_count(s, "seeds")), default=None,
                   help=f"seeds 0, 1, ... per configuration (default {SEEDS})")
    p.add_argument("--epochs", type=arguments.arg(lambda s: arguments.parse_count(s, "epochs")), default=None,
                   help=f"epochs, the same for every batch size (default {EPOCHS})")
    arguments.add_common_arguments(
        p, quick="BatchNorm and GroupNorm x batch 8, 32, 128 x 2 seeds x 2 epochs, 12-16 s on 2 cores")


def run(norms=None, batch_sizes=None, seeds=None, epochs=None, quick: bool = False, store: str = DEFAULT_STORE,
        workers: int | str = "auto", threads: int = 1, executor: str = "local", ray_address: str | None = None) -> dict:
    require("sklearn", "normlab experiment batch-size")  # before the store is opened or any work starts
    norms, sizes, seed_list, epochs = _check(norms, batch_sizes, seeds, epochs, quick)
    workers, threads, executor = sweep.check_parallel(workers, threads, executor)
    with sweep.interrupt_note(str(store)), sweep.open_store(store) as st:
        done = st.done(EXPERIMENT)
        tasks, skipped = [], 0
        # the slowest runs (small batches) first, so that a pool's workers finish together
        for b in sizes:
            for norm in norms:
                for s in seed_list:
                    if (config_key(config(norm, b, epochs)), s) in done:
                        skipped += 1
                    else:
                        tasks.append((train_task, {"norm": norm, "batch_size": b, "seed": s, "epochs": epochs}, 1))
        info = sweep.run_tasks(st, EXPERIMENT, tasks, workers=workers, threads=threads,
                           executor=executor, ray_address=ray_address)
        runs = [r for r in st.runs(EXPERIMENT, [config(n, b, epochs) for n in norms for b in sizes])
                if r["seed"] in seed_list]
    cells = {}
    for norm in norms:
        for b in sizes:
            accs = [r["final"]["test_acc"] for r in runs if r["config"]["norm"] == norm and r["config"]["batch_size"] == b]
            m, s = summaries.mean_std(accs)
            cells[(norm, b)] = {"norm": norm, "batch_size": b, "runs": len(accs), "mean": m, "std": s}
    return summaries.finite_or_none({"store": str(store), "norms": norms, "batch_sizes": sizes, "seeds": seed_list,
                             "epochs": epochs, "cells": list(cells.values()), "verdict": verdict(cells, sizes),
                             "speed": info, "skipped": skipped})


def render(r: dict) -> str:
    cells = {(c["norm"], c["batch_size"]): c for c in r["cells"]}
    rows = [[LABEL[n]] + [summaries.pm(cells[(n, b)]["mean"], cells[(n, b)]["std"]) for b in r["batch_sizes"]]
            for n in r["norms"]]
    return "\n".join([
        f"Accuracy vs batch size: CNN on digits, {r['epochs']} epochs at every batch size, lr 0.02 x B/32, "
        f"momentum 0.9, {summaries.plural(len(r['seeds']), 'seed')}; eval-mode test accuracy (mean ± std)",
        table(rows, ["norm"] + [f"B={b}" for b in r["batch_sizes"]]), "",
        "  " + r["verdict"], f"  Reference: {PAPER}.",
        "  " + summaries.speed_line(r["speed"], r["skipped"]), f"  store: {r['store']}"])
