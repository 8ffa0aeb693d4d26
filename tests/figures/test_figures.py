"""normlab figures: each picture's numbers against an independent oracle (the definition of
each norm, torch.nn, a hand-written recurrence, the chapter's printed numbers), its drawing
(title, labelled axes, legend), and the command's refusal of bad --out paths."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from normlab.experiments._mlp import chapter_mlp, moons
from normlab.figures import FIGURES, _plot, batch_dependence, norm_axes, running_stats, saturation, stability_map


# --- 1. what each norm normalises over -----------------------------------------------------

def _definition(name: str) -> torch.Tensor:
    """The shared-statistics set of x[PROBE], written from each norm's definition."""
    n, c, h, w = norm_axes.SHAPE
    n0, c0, _, _ = norm_axes.PROBE
    m = torch.zeros(n, c, h * w, dtype=torch.bool)
    if name == "BatchNorm2d":
        m[:, c0, :] = True                    # per channel, over the batch and the pixels
    elif name == "LayerNorm":
        m[n0] = True                          # per sample, over channels and pixels
    elif name == "InstanceNorm2d":
        m[n0, c0] = True                      # per sample and channel, over the pixels
    else:
        per = c // norm_axes.GROUPS
        g0 = c0 // per
        m[n0, g0 * per:(g0 + 1) * per] = True  # per sample and group of channels
    return m


def test_norm_axes_masks_are_the_definitions():
    data = norm_axes.compute()
    assert list(data["layers"]) == ["BatchNorm2d", "LayerNorm", "InstanceNorm2d", f"GroupNorm({norm_axes.GROUPS})"]
    for name, d in data["layers"].items():
        assert torch.equal(torch.tensor(d["mask"]), _definition(name)), name
    assert data["layers"]["BatchNorm2d"]["axes"] == ["N", "H·W"]
    assert data["layers"]["LayerNorm"]["axes"] == ["C", "H·W"]
    assert data["layers"]["InstanceNorm2d"]["axes"] == ["H·W"]
    assert data["layers"]["GroupNorm(2)"]["axes"] == ["C (3 of 6)", "H·W"]


def test_norm_axes_probe_agrees_with_torch_nn():
    n, c, h, w = norm_axes.SHAPE
    twins = {"BatchNorm2d": torch.nn.BatchNorm2d(c), "LayerNorm": torch.nn.LayerNorm([c, h, w]),
             "InstanceNorm2d": torch.nn.InstanceNorm2d(c), "GroupNorm(2)": torch.nn.GroupNorm(2, c)}
    for name, layer in twins.items():
        assert torch.equal(norm_axes.shared_statistics(layer), _definition(name)), name


# --- 2. the chapter's MLP while it trains -------------------------------------------------------

def _first_forward_by_hand(norm: str) -> list[torch.Tensor]:
    """Each Tanh's input of the first forward, from torch.nn's weights and the formulas (float64)."""
    model = chapter_mlp(norm, 123, torch.nn)
    linears = [m for m in model if isinstance(m, torch.nn.Linear)][:3]
    X, _ = moons()
    a, out = X.double(), []
    for lin in linears:
        z = a @ lin.weight.double().T + lin.bias.double()
        if norm == "batch":   # train mode: batch mean, biased variance, eps 1e-5, identity affine
            z = (z - z.mean(0)) / torch.sqrt(z.var(0, unbiased=False) + 1e-5)
        out.append(z)
        a = torch.tanh(z)
    return out


@pytest.mark.parametrize("norm", ["none", "batch"])
def test_saturation_first_epoch_matches_hand_forward(norm):
    rec = saturation.record(norm, epochs=2)
    for k, h in enumerate(_first_forward_by_hand(norm)):
        layer = rec["layers"][k]
        assert layer["mean"][0] == pytest.approx(h.mean().item(), abs=1e-5)
        assert layer["std"][0] == pytest.approx(h.std(unbiased=False).item(), rel=1e-5)
        assert layer["saturated"][0] == pytest.approx((h.abs() > math.atanh(0.99)).double().mean().item(),
                                                      abs=2 / h.numel())
        assert sum(layer["hist"][0]) == h.numel() == 300 * 64


def test_saturation_batchnorm_run_is_the_chapters():
    # seeds/001, mlp_dengan_tanpa_batchnorm.py prints the BatchNorm run's loss at epochs 1 and 5
    rec = saturation.record("batch", epochs=5)
    assert round(rec["train_loss"][0], 4) == 0.5619
    assert round(rec["train_loss"][4], 4) == 12.9122


# --- 3. batch dependence -------------------------------------------------------------------------

def test_batch_dependence_matches_torch_nn_and_the_layernorm_formula():
    ours, twin = batch_dependence.compute(), batch_dependence.compute(layers=torch.nn)
    for name in ("BatchNorm1d", "LayerNorm"):
        for mode in ("train", "eval"):
            a, b = torch.tensor(ours["layers"][name][mode]["outputs"]), torch.tensor(twin["layers"][name][mode]["outputs"])
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert ours["layers"]["BatchNorm1d"]["train"]["spread"] > 0.5
    for name, mode in (("BatchNorm1d", "eval"), ("LayerNorm", "train"), ("LayerNorm", "eval")):
        assert ours["layers"][name][mode]["spread"] == 0.0
    s = torch.tensor(ours["sample"], dtype=torch.float64)
    ln = (s - s.mean()) / torch.sqrt(s.var(unbiased=False) + 1e-5)
    torch.testing.assert_close(torch.tensor(ours["layers"]["LayerNorm"]["train"]["outputs"][0], dtype=torch.float64),
                               ln, atol=1e-5, rtol=0)


# --- 4. running statistics -----------------------------------------------------------------------

def test_running_stats_follow_the_hand_recurrence():
    steps = 60
    data = running_stats.compute(steps=steps)
    xs = [b.double() for b in running_stats.batches(0, steps)]
    for mom in running_stats.MOMENTA:
        rm, rv = 0.0, 1.0
        for t, xb in enumerate(xs, start=1):
            f = 1.0 / t if mom is None else mom
            rm = (1 - f) * rm + f * xb.mean().item()
            rv = (1 - f) * rv + f * xb.var(unbiased=True).item()   # the unbiased batch variance
        run = data["runs"][str(mom)]
        assert run["running_mean"][-1] == pytest.approx(rm, abs=1e-5)
        assert run["running_var"][-1] == pytest.approx(rv, abs=1e-5)
    # momentum None is the plain average of the batch means
    avg = sum(xb.mean().item() for xb in xs) / steps
    assert data["runs"]["None"]["running_mean"][-1] == pytest.approx(avg, abs=1e-5)


# --- 5. the stability heat map -------------------------------------------------------------------

def _cells():
    norms, lrs = ["none", "batch"], [0.1, 2.0, 4.0]
    acc = {("none", 0.1): 0.84, ("none", 2.0): 0.57, ("none", 4.0): 0.6,
           ("batch", 0.1): 0.87, ("batch", 2.0): 0.88, ("batch", 4.0): 0.83}
    failed = {("none", 2.0): 0.75, ("none", 4.0): 1.0, ("batch", 4.0): 0.5}
    # the old rule's share, deliberately different: the figure must not draw it
    diverged = {("none", 0.1): 0.25, ("none", 4.0): 0.5}
    cells = [{"norm": n, "lr": lr, "runs": 4, "acc_mean": acc[n, lr], "acc_std": 0.01,
              "failed": failed.get((n, lr), 0.0), "diverged": diverged.get((n, lr), 0.0),
              "seeds": [1, 2, 3, 4]} for n in norms for lr in lrs]
    return {"norms": norms, "labels": {"none": "no norm", "batch": "BatchNorm1d"}, "lrs": lrs,
            "seeds": [1, 2, 3, 4], "epochs": 30, "cells": cells}


def test_stability_map_puts_each_cell_in_its_place(tmp_path):
    data = _cells()
    fig = stability_map.draw(data, tmp_path / "s.png")
    ax = fig.axes[0]
    shown = np.asarray(ax.images[0].get_array())
    np.testing.assert_allclose(shown, [[0.84, 0.57, 0.6], [0.87, 0.88, 0.83]])
    hatched = sorted((p.get_x() + 0.5, p.get_y() + 0.5) for p in ax.patches if p.get_hatch())
    assert hatched == [(1, 0), (2, 0), (2, 1)]      # (lr index, norm index) of the cells where some seed failed
    texts = [t.get_text() for t in ax.texts]
    assert "0.57 ± 0.01\nfailed 75%" in texts
    assert "0.84 ± 0.01\nfailed 0%" in texts       # diverged 25% by the old rule: not drawn
    assert not any("diverged" in t for t in texts)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["no norm", "BatchNorm1d"]
    legend = " ".join(t.get_text() for t in ax.get_legend().get_texts())
    assert "failed to train" in legend and "diverged" not in legend and "10x" not in legend
    assert "0.558" in legend                          # 0.5 + 2 * sqrt(0.25 / 300), the chance limit


def _record(norm, lr, seed, train_loss, eval_loss, eval_acc):
    return {"config": {"norm": norm, "lr": lr}, "seed": seed, "epochs": {"train_loss": train_loss},
            "final": {"eval_loss": eval_loss, "eval_acc": eval_acc, "train_loss": train_loss[-1],
                      "diverged": False}}


def test_stability_map_marks_runs_that_failed_to_train_from_stored_runs(tmp_path):
    """Stored runs whose fate is known by hand (issue 27's LayerNorm seed 124: chance accuracy,
    last loss 3x the first, not 10x: 'not diverged' by the old rule, failed to train by the new)."""
    from normlab.experiments import stability

    runs = [_record("layer", 2.0, 123, [0.71, 0.5, 0.3], 0.3, 0.90),              # trained
            _record("layer", 2.0, 124, [0.71, 3.0, 2.08], 11.6, 0.50),            # chance: failed
            _record("layer", 0.1, 123, [0.70, 0.6, 0.4], 0.4, 0.86),              # trained
            _record("layer", 0.1, 124, [0.70, 0.6, 0.4], 0.4, 0.5 + 2 * math.sqrt(0.25 / 300) + 1e-3),
            _record("batch", 2.0, 123, [0.60, 0.9, 0.61], 0.5, 0.80),             # last loss above first: failed
            _record("batch", 2.0, 124, [0.60, float("nan"), 0.5], 0.5, 0.80),     # NaN: failed
            _record("batch", 0.1, 123, [0.60, 0.5, 0.4], 0.4, 0.87),
            _record("batch", 0.1, 124, [0.60, 0.5, 0.4], 0.4, 0.5 + 2 * math.sqrt(0.25 / 300))]  # at the limit: failed
    norms, lrs = ["layer", "batch"], [0.1, 2.0]
    data = {"norms": norms, "labels": {"layer": "LayerNorm", "batch": "BatchNorm1d"}, "lrs": lrs,
            "seeds": [123, 124], "epochs": 3, "cells": stability.summarize(runs, norms, lrs)}
    acc, failed = stability_map.grid(data)
    np.testing.assert_allclose(failed, [[0.0, 0.5], [0.5, 1.0]])
    fig = stability_map.draw(data, tmp_path / "s.png")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "0.70 ± 0.28\nfailed 50%" in texts      # LayerNorm at lr 2: (0.9 + 0.5) / 2, sample std sqrt(0.08) over 2 seeds
    assert "0.80 ± 0.00\nfailed 100%" in texts


# --- every figure: readable at a glance ----------------------------------------------------------

def _check_readable(fig):
    info = _plot.labels(fig)
    assert info["suptitle"].strip()
    plain = [a for a in info["axes"] if a["title"] or a["xlabel"]]
    assert plain, "no axes"
    for a in plain:
        assert a["title"].strip() and a["xlabel"].strip() and a["ylabel"].strip(), a
        assert "(" in a["xlabel"] and "(" in a["ylabel"], f"axis without a unit: {a}"
    assert any(a["legend"] for a in info["axes"]) or any(info["figure_legends"]), "no legend"


@pytest.mark.parametrize("mod", [norm_axes, batch_dependence, running_stats])
def test_figures_are_labelled(mod, tmp_path):
    fig = mod.draw(mod.compute(), tmp_path / "f.png")
    _check_readable(fig)
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_saturation_and_stability_map_are_labelled(tmp_path):
    data = {"lr": 2.0, "epochs": 2, "range": saturation.RANGE, "bins": saturation.BINS,
            "saturated_at": saturation.SATURATED, "runs": {n: saturation.record(n, 2) for n in saturation.NORMS}}
    _check_readable(saturation.draw(data, tmp_path / "a.png"))
    _check_readable(stability_map.draw(_cells(), tmp_path / "b.png"))


# --- the command ---------------------------------------------------------------------------------

def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "normlab", "figures", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


@pytest.mark.parametrize("kind", ["file", "under_file", "empty", "unknown_only"])
def test_bad_out_is_refused_before_any_work(tmp_path, kind):
    f = tmp_path / "a.png"
    f.write_bytes(b"x")
    out = {"file": str(f), "under_file": str(f / "sub"), "empty": "", "unknown_only": str(tmp_path / "new")}[kind]
    extra = ["--only", "nope"] if kind == "unknown_only" else []
    p = _cli("--out", out, *extra)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and p.stderr.startswith("normlab figures:")
    assert p.stdout == ""
    assert not (tmp_path / "new").exists()        # nothing made before the arguments were checked
    assert f.read_bytes() == b"x"


def test_command_writes_the_pngs_it_names(tmp_path):
    out = tmp_path / "deep" / "figs"
    p = _cli("--out", str(out), "--only", "running_stats,batch_dependence")
    assert p.returncode == 0, p.stderr
    for name in ("running_stats", "batch_dependence"):
        png = out / f"{name}.png"
        assert str(png) in p.stdout
        img = __import__("matplotlib.image", fromlist=["imread"]).imread(png)
        assert img.shape[0] > 300 and img.shape[1] > 600
    assert sorted(x.name for x in out.iterdir()) == ["batch_dependence.png", "running_stats.png"]
    assert set(FIGURES) == {"norm_axes", "saturation", "batch_dependence", "running_stats", "stability_map"}


# --- every figure: readable at the documentation page's width ----------------------------------

PAGE_PX = 700        # the site's content column; a wider picture is shrunk to it


def _drawn(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def _smallest_text_px(fig) -> float:
    """The smallest axis label, title or legend text, in pixels once the figure fits the page."""
    _drawn(fig)
    scale = min(1.0, PAGE_PX / (fig.get_figwidth() * fig.dpi))
    texts = [t for ax in fig.axes for t in (ax.title, ax.xaxis.label, ax.yaxis.label) if t.get_text()]
    texts += [t for leg in fig.legends for t in leg.get_texts()]
    return min(t.get_fontsize() * fig.dpi / 72 * scale for t in texts)


def _lines_under_legends(fig) -> list:
    """Data points of any panel that a legend (the panel's or the figure's) covers."""
    renderer = _drawn(fig)
    boxes = [leg.get_window_extent(renderer) for leg in fig.legends]
    boxes += [ax.get_legend().get_window_extent(renderer) for ax in fig.axes if ax.get_legend()]
    covered = []
    for ax in fig.axes:
        for line in ax.get_lines():
            for x, y in ax.transData.transform(line.get_xydata()):
                covered += [(line.get_label(), x, y) for b in boxes if b.contains(x, y)]
    return covered


@pytest.mark.parametrize("mod", [norm_axes, batch_dependence, running_stats])
def test_figure_text_is_readable_at_page_width(mod, tmp_path):
    fig = mod.draw(mod.compute(), tmp_path / "f.png")
    assert _smallest_text_px(fig) >= 9.0


@pytest.mark.parametrize("mod", [batch_dependence, running_stats])
def test_no_legend_covers_the_data(mod, tmp_path):
    fig = mod.draw(mod.compute(), tmp_path / "f.png")
    assert not _lines_under_legends(fig)
