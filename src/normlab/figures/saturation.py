"""Figure 2: inside the chapter's network while it trains at lr = 2.0.

The BatchNorm chapter's MLP ([2, 64, 64, 64, 2], Tanh, full-batch SGD on make_moons(300,
noise=0.30), seed 123) is trained for 30 epochs without a norm and with
``normlab.nn.BatchNorm1d`` before each Tanh. At every epoch, the input of each Tanh (the
pre-activations of the 300 points x 64 units) is recorded by a forward pre-hook:
its histogram per epoch, and the share of values where Tanh is saturated
(|h| > atanh(0.99) = 2.65, where its slope is below 0.02).
"""

from __future__ import annotations

import math

import torch

from .. import nn as nl
from ..experiments._mlp import CHAPTER_SEED, EPOCHS, chapter_mlp, moons

LR = 2.0
SATURATED = math.atanh(0.99)          # |h| above this: tanh'(h) < 0.0199
RANGE = 8.0                           # histogram range [-RANGE, RANGE]; values beyond go to the end bins
BINS = 64
NORMS = {"none": "no norm", "batch": "BatchNorm1d before each Tanh"}
TITLE = "Inside the chapter's MLP at lr = 2.0: the input of each Tanh while it trains"


def record(norm: str, epochs: int = EPOCHS, lr: float = LR, layers=nl) -> dict:
    """Train the chapter's MLP (norm from ``layers``) and record each Tanh's input at every epoch.

    Per hidden layer and epoch: ``hist`` (BINS counts over [-RANGE, RANGE], outer values
    clipped into the end bins), ``mean``, ``std`` and ``saturated`` (the share with
    |h| > atanh(0.99)); the training loss per epoch."""
    X, y = moons()
    model = chapter_mlp(norm, CHAPTER_SEED, layers)
    tanhs = [m for m in model if isinstance(m, torch.nn.Tanh)]
    seen: list[torch.Tensor] = []
    hooks = [t.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach().clone())) for t in tanhs]
    per_layer = [{"hist": [], "mean": [], "std": [], "saturated": []} for _ in tanhs]
    losses = []
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    crit = torch.nn.CrossEntropyLoss()
    try:
        for _ in range(epochs):
            model.train()
            seen.clear()
            opt.zero_grad()
            loss = crit(model(X), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            for rec, h in zip(per_layer, seen):
                h = h.double()
                rec["hist"].append(torch.histc(h.clamp(-RANGE, RANGE), bins=BINS, min=-RANGE, max=RANGE).tolist())
                rec["mean"].append(h.mean().item())
                rec["std"].append(h.std(unbiased=False).item())
                rec["saturated"].append((h.abs() > SATURATED).double().mean().item())
    finally:
        for hk in hooks:
            hk.remove()
    return {"norm": norm, "lr": lr, "epochs": epochs, "train_loss": losses, "layers": per_layer}


def compute(epochs: int = EPOCHS) -> dict:
    return {"lr": LR, "epochs": epochs, "range": RANGE, "bins": BINS, "saturated_at": SATURATED,
            "runs": {norm: record(norm, epochs) for norm in NORMS}}


def draw(data: dict, path) -> object:
    """Rows: no norm, BatchNorm (histograms over epochs); last row: saturated share per epoch."""
    import numpy as np
    from ._plot import new_figure, save

    runs = data["runs"]
    n_layers = len(next(iter(runs.values()))["layers"])
    fig = new_figure(13, 9)
    grid = fig.add_gridspec(3, n_layers)
    ep = data["epochs"]
    r = data["range"]
    im = None
    for i, (norm, label) in enumerate(NORMS.items()):
        for k, rec in enumerate(runs[norm]["layers"]):
            ax = fig.add_subplot(grid[i, k])
            h = np.array(rec["hist"]).T                          # (bins, epochs)
            share = 100.0 * h / h.sum(axis=0, keepdims=True)
            im = ax.imshow(share, origin="lower", aspect="auto", cmap="viridis", extent=(0.5, ep + 0.5, -r, r),
                           vmin=0, vmax=min(40.0, float(share.max())))
            ax.axhline(data["saturated_at"], color="w", ls=":", lw=1)
            ax.axhline(-data["saturated_at"], color="w", ls=":", lw=1)
            ax.set_title(f"{label}: hidden layer {k + 1}\n{100 * rec['saturated'][-1]:.0f}% saturated at epoch {ep}",
                         fontsize=9)
            ax.set_xlabel("epoch (one full-batch SGD step)")
            ax.set_ylabel("Tanh input h (no unit)")
    fig.colorbar(im, ax=fig.axes, label="share of the 300 x 64 values in the bin (%)", shrink=0.6)
    for k in range(n_layers):
        ax = fig.add_subplot(grid[2, k])
        for norm, label in NORMS.items():
            sat = runs[norm]["layers"][k]["saturated"]
            ax.plot(range(1, ep + 1), [100 * s for s in sat], marker=".", label=label)
        ax.set_ylim(-2, 102)
        ax.set_title(f"hidden layer {k + 1}: saturated Tanh inputs", fontsize=9)
        ax.set_xlabel("epoch (one full-batch SGD step)")
        ax.set_ylabel("|h| > 2.65, tanh' < 0.02 (% of values)")
        ax.legend(fontsize=8)
    fig.suptitle(f"{TITLE}\n(white dotted lines: |h| = 2.65, beyond which Tanh is saturated; values beyond "
                 f"±{r:g} are counted in the end bins)")
    save(fig, path)
    return fig
