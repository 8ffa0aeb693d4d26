"""Figure 4: running statistics against the population they estimate.

Batches of 16 values are drawn from one population, N(mean 3, std 2) -- so the true mean is 3
and the true variance 4 -- and fed to ``normlab.nn.BatchNorm1d(1)`` in train mode for 300
steps, with ``momentum`` 0.1, 0.01 and None (a cumulative average over
``num_batches_tracked``). ``running_mean`` and ``running_var`` (which is updated with the
*unbiased* batch variance) are recorded after every step. Every layer sees the same batches.
"""

from __future__ import annotations

import torch

from .. import nn as nl

POP_MEAN, POP_STD = 3.0, 2.0
BATCH = 16
STEPS = 300
MOMENTA = (0.1, 0.01, None)
TITLE = "Running statistics against the population: BatchNorm1d's momentum"


def batches(seed: int = 0, steps: int = STEPS) -> list[torch.Tensor]:
    """The (BATCH, 1) batches every layer sees."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(BATCH, 1, generator=g) * POP_STD + POP_MEAN for _ in range(steps)]


@torch.no_grad()
def compute(layers=nl, seed: int = 0, steps: int = STEPS) -> dict:
    """running_mean/running_var after each step, per momentum; ``layers``: normlab.nn or torch.nn."""
    xs = batches(seed, steps)
    runs = {}
    for mom in MOMENTA:
        bn = layers.BatchNorm1d(1, momentum=mom).train()
        means, vars_ = [], []
        for xb in xs:
            bn(xb)
            means.append(bn.running_mean.item())
            vars_.append(bn.running_var.item())
        runs[str(mom)] = {"momentum": mom, "running_mean": means, "running_var": vars_}
    return {"population": {"mean": POP_MEAN, "var": POP_STD ** 2}, "batch": BATCH, "steps": steps, "runs": runs}


def draw(data: dict, path) -> object:
    """Two panels (mean, variance) against the training step, the population value dashed."""
    from ._plot import new_figure, save

    fig = new_figure(9, 5.2)
    axes = fig.subplots(1, 2)
    steps = range(1, data["steps"] + 1)
    for ax, key, what in ((axes[0], "running_mean", "mean"), (axes[1], "running_var", "var")):
        for run in data["runs"].values():
            mom = run["momentum"]
            label = "momentum=None (cumulative average)" if mom is None else f"momentum={mom:g}"
            ax.plot(steps, run[key], label=label, lw=1.3)
        ax.axhline(data["population"][what], color="k", ls="--", lw=1.2,
                   label="the population's value")
        ax.set_xlabel("training step (one batch of 16)")
        ax.set_ylabel(f"{key} (units of x{'' if what == 'mean' else '²'})")
        ax.set_title(f"{key}: starts at {0 if what == 'mean' else 1}, should reach {data['population'][what]:g}",
                     fontsize=11)
        ax.grid(alpha=0.3)
    # one legend under both panels (inside one it covered the curves)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=2, frameon=False, fontsize=10)
    fig.suptitle(f"{TITLE}\n(batches of {data['batch']} from N(mean {POP_MEAN:g}, std {POP_STD:g}); "
                 "momentum is the weight of the new batch's statistic)")
    save(fig, path)
    return fig
