"""Figure 5: the stability study as a heat map -- final accuracy per norm and learning rate.

The cells come from ``normlab experiment stability`` (``experiments.stability.run``): the
chapter's MLP with each norm at each learning rate over several weight seeds, read back
from a store. By default the quick study (5 norms x lr 0.1, 1, 2, 4 x 4 seeds, a few
seconds) runs into the store first; runs already there are not trained again.
Colour: mean final eval accuracy; text: mean ± std and the share of seeds that failed to
train (the cells' ``failed``, by :data:`normlab.experiments._mlp.FAILURE_RULE`: a NaN/inf
loss, final eval accuracy no better than chance, or a last training loss not below the
first); hatched: at least one seed failed to train.
"""

from __future__ import annotations

TITLE = "Training stability of the chapter's MLP: final accuracy by norm and learning rate"


def compute(store: str, quick: bool = True) -> dict:
    """Run (or read back) the stability study in ``store``; returns its cells."""
    from ..experiments import stability

    r = stability.run(quick=quick, store=store, workers=1)
    s = r["study"]
    return {"norms": s["norms"], "labels": {n: stability.LABEL[n] for n in s["norms"]}, "lrs": s["lrs"],
            "seeds": s["seeds"], "epochs": s["epochs"], "cells": s["cells"], "store": str(store)}


def grid(data: dict):
    """(norms x lrs) arrays of mean accuracy and the share of runs that failed to train,
    NaN where a cell has no runs."""
    import numpy as np

    acc = np.full((len(data["norms"]), len(data["lrs"])), np.nan)
    failed = np.full_like(acc, np.nan)
    for c in data["cells"]:
        i, j = data["norms"].index(c["norm"]), data["lrs"].index(c["lr"])
        if c["runs"]:
            acc[i, j], failed[i, j] = c["acc_mean"], c["failed"]
    return acc, failed


def draw(data: dict, path) -> object:
    from matplotlib.patches import Patch, Rectangle

    from ..experiments._mlp import chance_limit
    from ._plot import new_figure, save

    acc, failed = grid(data)
    stds = {(c["norm"], c["lr"]): c["acc_std"] for c in data["cells"]}
    fig = new_figure(9, 5.6)
    ax = fig.add_subplot()
    im = ax.imshow(acc, cmap="RdYlGn", vmin=0.5, vmax=1.0, aspect="auto")
    for i, norm in enumerate(data["norms"]):
        for j, lr in enumerate(data["lrs"]):
            if acc[i, j] != acc[i, j]:
                ax.text(j, i, "no runs", ha="center", va="center", fontsize=8)
                continue
            if failed[i, j] > 0:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", edgecolor="0.25", lw=0))
            std = stds.get((norm, lr)) or 0.0
            ax.text(j, i, f"{acc[i, j]:.2f} ± {std:.2f}\nfailed {100 * failed[i, j]:.0f}%", ha="center",
                    va="center", fontsize=8, bbox={"facecolor": "white", "alpha": 0.7, "lw": 0, "pad": 1.5})
    ax.set_xticks(range(len(data["lrs"])), [f"{lr:g}" for lr in data["lrs"]])
    ax.set_yticks(range(len(data["norms"])), [data["labels"][n] for n in data["norms"]])
    ax.set_xlabel("learning rate (full-batch SGD, no unit)")
    ax.set_ylabel("norm before each Tanh (layer class)")
    seeds = data["seeds"]
    ax.set_title(f"mean ± std over {len(seeds)} seeds ({seeds[0]}..{seeds[-1]}), {data['epochs']} epochs",
                 fontsize=10)
    fig.colorbar(im, ax=ax, label="final eval accuracy (fraction of the 300 points)")
    ax.legend(handles=[Patch(facecolor="white", edgecolor="0.25", hatch="///",
                             label="some seeds failed to train: NaN/inf loss, final eval accuracy "
                                   f"<= {chance_limit():.3f} (chance + 2 SE), or last training loss "
                                   "not below the first")],
              loc="upper center", bbox_to_anchor=(0.5, -0.13), frameon=False, fontsize=8)
    fig.suptitle(TITLE, fontsize=11)
    save(fig, path)
    return fig
