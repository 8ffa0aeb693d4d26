"""Figure 3: batch dependence -- one fixed sample, its batch mates replaced again and again.

A fixed sample ``s`` (6 features) is put first in a batch of 8 whose other 7 samples are
drawn afresh each time (``randn * 3 + 1``), 24 times. Its output from ``normlab.nn.BatchNorm1d(6)``
and ``normlab.nn.LayerNorm(6)`` is recorded in train mode and in eval mode (the BatchNorm after
50 train-mode steps on batches from the same distribution, so that its running statistics
are set). Only BatchNorm in train mode moves with the batch mates.
"""

from __future__ import annotations

import torch

from .. import nn as nl

FEATURES = 6
BATCH = 8
DRAWS = 24
WARM_STEPS = 50
TITLE = "Batch dependence: one fixed sample's output as the rest of its batch is replaced"


def _mates(g: torch.Generator, n: int) -> torch.Tensor:
    return torch.randn(n, FEATURES, generator=g) * 3.0 + 1.0


@torch.no_grad()
def compute(layers=nl, seed: int = 0) -> dict:
    """Outputs of the fixed sample, (DRAWS, FEATURES), per layer and mode; ``layers`` is
    ``normlab.nn`` (the figure) or ``torch.nn`` (the tests' oracle)."""
    g = torch.Generator().manual_seed(seed)
    s = _mates(g, 1)                                                   # (1, F)
    warm = [_mates(g, BATCH) for _ in range(WARM_STEPS)]
    batches = [torch.cat([s, _mates(g, BATCH - 1)]) for _ in range(DRAWS)]
    out = {"sample": s[0].tolist(), "layers": {}}
    for name in ("BatchNorm1d", "LayerNorm"):
        res = {}
        for mode in ("train", "eval"):
            m = getattr(layers, name)(FEATURES)
            if mode == "eval":
                for xb in warm:
                    m(xb)
                m.eval()
            ys = torch.stack([m(xb)[0] for xb in batches])             # (DRAWS, F)
            res[mode] = {"outputs": ys.tolist(), "spread": (ys.max(0).values - ys.min(0).values).max().item()}
        out["layers"][name] = res
    return out


def draw(data: dict, path) -> object:
    """2 x 2 panels (layer x mode): each feature of the fixed sample's output per draw."""
    import numpy as np
    from ._plot import new_figure, save

    fig = new_figure(9, 7.6)
    axes = fig.subplots(2, 2, sharex=True, sharey=True)
    for i, (name, res) in enumerate(data["layers"].items()):
        for j, mode in enumerate(("train", "eval")):
            ax = axes[i][j]
            ys = np.array(res[mode]["outputs"])
            for f in range(ys.shape[1]):
                ax.plot(range(1, ys.shape[0] + 1), ys[:, f], marker=".", label=f"feature {f}")
            moved = res[mode]["spread"]
            verdict = f"moves by up to {moved:.2f}" if moved > 1e-6 else "never moves"
            ax.set_title(f"{name}, {mode} mode: the output {verdict}", fontsize=11)
            ax.set_xlabel(f"batch (the {BATCH - 1} other samples redrawn each time)", fontsize=10)
            ax.set_ylabel("output (normalised units)", fontsize=10)
            ax.grid(alpha=0.3)
    # one legend for the four panels, under them: inside a panel it covered the curves
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncol=len(names), frameon=False, fontsize=10)
    fig.suptitle(f"{TITLE}\n(batch of {BATCH}, {FEATURES} features; eval-mode BatchNorm after {WARM_STEPS} "
                 "training steps)")
    save(fig, path)
    return fig
