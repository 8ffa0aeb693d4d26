"""Figure 1: what each norm normalises over, measured from the layers themselves.

For an (N, C, H, W) input, one value ``x[n0, c0, h0, w0]`` is nudged and the layer
(``normlab.nn``, train mode) is run again: the outputs that change are exactly the
values that share that value's mean and variance. That set, drawn in the
(N, C, H*W) block, is the shaded region of Wu & He (2018), Figure 2 -- measured
here, not drawn by hand.
"""

from __future__ import annotations

import torch

from .. import nn as nl
from ._plot import new_figure, save

SHAPE = (4, 6, 2, 2)          # N, C, H, W: H*W = 4 pixels
PROBE = (1, 1, 0, 0)          # the nudged value: sample 1, channel 1, pixel (0, 0)
GROUPS = 2                    # GroupNorm(2, 6): 3 channels per group
AXES = ("N", "C", "H·W")
TITLE = "What each norm normalises over: the values that share one mean and variance"


def layers(c: int = SHAPE[1]) -> dict[str, torch.nn.Module]:
    """The four norms of Wu & He's Figure 2, from normlab.nn, as they are built by users."""
    _, _, h, w = SHAPE
    return {
        "BatchNorm2d": nl.BatchNorm2d(c),
        "LayerNorm": nl.LayerNorm([c, h, w]),
        "InstanceNorm2d": nl.InstanceNorm2d(c),
        f"GroupNorm({GROUPS})": nl.GroupNorm(GROUPS, c),
    }


@torch.no_grad()
def shared_statistics(layer: torch.nn.Module, shape=SHAPE, probe=PROBE, seed: int = 0) -> torch.Tensor:
    """A bool (N, C, H*W) mask: the outputs that move when ``x[probe]`` moves."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    x2 = x.clone()
    x2[probe] += 1.0
    moved = (layer.train()(x2) - layer(x)).abs() > 1e-6
    return moved.reshape(shape[0], shape[1], -1)


def spanned(mask: torch.Tensor) -> list[str]:
    """The axes along which the mask holds more than one index (the statistics' axes)."""
    out = []
    for d, name in enumerate(AXES):
        n_along = mask.any(dim=tuple(i for i in range(3) if i != d)).sum().item()
        if n_along > 1:
            out.append(name if n_along == mask.shape[d] else f"{name} ({n_along} of {mask.shape[d]})")
    return out


def compute() -> dict:
    """Masks and spanned axes for each of the four layers."""
    res = {}
    for name, layer in layers().items():
        mask = shared_statistics(layer)
        res[name] = {"mask": mask.tolist(), "axes": spanned(mask), "count": int(mask.sum())}
    return {"shape": list(SHAPE), "probe": list(PROBE), "layers": res}


def draw(data: dict, path) -> object:
    """Four 3-D blocks (N across, C in depth, H*W up), the shared set shaded; 2 x 2, so that the
    labels stay readable when the picture is shrunk to a page's width."""
    import numpy as np
    from matplotlib.patches import Patch
    from mpl_toolkits.mplot3d import Axes3D  # noqa: F401  (registers the 3d projection)

    fig = new_figure(9, 8.4)
    shade, rest = "#1f77b4", "#d9d9d9"
    for k, (name, d) in enumerate(data["layers"].items()):
        ax = fig.add_subplot(2, 2, k + 1, projection="3d")
        mask = np.array(d["mask"])                       # (N, C, HW)
        # two solids: the shared set, opaque, and the rest, faint (voxels draws outer faces only)
        ax.voxels(mask, facecolors=shade, edgecolor=(0.1, 0.2, 0.4, 0.6), linewidth=0.4, alpha=0.9)
        ax.voxels(~mask, facecolors=rest, edgecolor=(0.3, 0.3, 0.3, 0.3), linewidth=0.3, alpha=0.12)
        ax.set_xlabel("N: sample (index)", fontsize=11)
        ax.set_ylabel("C: channel (index)", fontsize=11)
        ax.set_zlabel("H·W: pixel (index)", fontsize=11, labelpad=-2)
        ax.tick_params(labelsize=10)
        ax.set_box_aspect(None, zoom=0.85)
        ax.set_title(f"{name}\nstatistics over {', '.join(d['axes'])}", fontsize=12)
        ax.view_init(elev=22, azim=-58)
        for axis, n in zip((ax.set_xticks, ax.set_yticks, ax.set_zticks), mask.shape):
            axis(range(0, n + 1, max(1, n // 2)))
    n0, c0, h0, w0 = data["probe"]
    fig.legend(handles=[Patch(color=shade, label=f"values that share the mean/variance of x[{n0}, {c0}, {h0}, {w0}]"),
                        Patch(color=rest, label="values normalised with other statistics")],
               loc="outside lower center", ncol=1, frameon=False, fontsize=11)
    n, c, h, w = data["shape"]
    fig.suptitle(f"{TITLE}\n(input (N, C, H, W) = ({n}, {c}, {h}, {w}); measured by nudging one value)")
    save(fig, path)
    return fig
