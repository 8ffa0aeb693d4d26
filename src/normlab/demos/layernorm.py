"""``normlab demo layernorm``: the LayerNorm chapter's ``layernorm_manual.py``, live.

Source: the LayerNorm chapter (``normlab.demos.SOURCES``). With
``torch.manual_seed(42)``, ``x = torch.randn(4, 6) * 3.0 + 5.0`` is normalised
per row by hand (mean and biased variance over the 6 features, gamma/beta
applied) and by ``normlab.nn.LayerNorm`` and ``torch.nn.LayerNorm`` with the
same gamma/beta. Then the third sample is normalised alone and inside a batch
with three random mates (``torch.randn(3, 6) * 10.0``, the next draw of the same
generator): LayerNorm gives the same output, while BatchNorm1d in train mode
gives different outputs for two batch compositions.

The random draws come from a private ``torch.Generator`` seeded with 42, which
yields exactly the numbers of the chapter's ``torch.manual_seed(42)`` call
sequence without touching the global RNG.
"""

from __future__ import annotations

import torch

from .. import nn as nl
from ._lang import add_lang_argument, check_lang, say
from . import source_label
from ._report import fmt, max_abs_diff, table

CHAPTER = source_label("layernorm", "layernorm_manual.py")
SEED = 42
GAMMA = [1.0, 2.0, 0.5, 1.0, 1.0, 1.0]
BETA = [0.0, 0.0, 0.0, -2.0, 0.0, 0.0]
EPS = 1e-5
IMPLS = ("normlab", "torch")
LABEL = {"manual": "manual", "normlab": "normlab", "torch": "torch.nn"}


def _layer_norm(impl: str, affine: bool) -> torch.nn.Module:
    cls = nl.LayerNorm if impl == "normlab" else torch.nn.LayerNorm
    ln = cls(6, eps=EPS, elementwise_affine=affine)
    if affine:
        ln.weight.copy_(torch.tensor(GAMMA))
        ln.bias.copy_(torch.tensor(BETA))
    return ln


def _batch_norm(impl: str) -> torch.nn.Module:
    return (nl.BatchNorm1d if impl == "normlab" else torch.nn.BatchNorm1d)(6)


def _x_hat_stats(x_hat: torch.Tensor) -> dict:
    return {
        "row_mean": [v + 0.0 for v in x_hat.mean(dim=1).tolist()],
        "row_std": x_hat.std(dim=1, unbiased=False).tolist(),
        "col_mean": x_hat.mean(dim=0).tolist(),
    }


def add_arguments(parser) -> None:
    add_lang_argument(parser)


@torch.no_grad()
def run(seed: int = SEED, lang: str = "en") -> dict:
    """Compute every number of ``layernorm_manual.py`` with normlab, torch.nn and by hand
    (``lang``: the language ``render`` explains in, ``en`` or ``id``)."""
    check_lang(lang)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 6, generator=g) * 3.0 + 5.0  # 4 samples, 6 features
    gamma, beta = torch.tensor(GAMMA), torch.tensor(BETA)

    # 1. the formula by hand, exactly as the chapter writes it
    mean = x.mean(dim=1, keepdim=True)
    var = x.var(dim=1, unbiased=False, keepdim=True)
    x_hat = (x - mean) / torch.sqrt(var + EPS)
    y = {"manual": x_hat * gamma + beta}
    x_hats = {"manual": x_hat}
    ln = {}
    for impl in IMPLS:
        ln[impl] = _layer_norm(impl, affine=True)
        y[impl] = ln[impl](x)
        x_hats[impl] = _layer_norm(impl, affine=False)(x)

    # 2. the third sample alone and with three random, large batch mates
    s = x[2:3]
    mates = torch.randn(3, 6, generator=g) * 10.0
    other_batch = torch.cat([s, mates])
    independence = {}
    contrast = {}
    for impl in IMPLS:
        alone, in_batch = ln[impl](s), ln[impl](other_batch)
        independence[impl] = {
            "alone": alone[0].tolist(),
            "in_batch": in_batch[0].tolist(),
            "identical": torch.allclose(alone, in_batch[0:1]),
        }
        bn = _batch_norm(impl)  # train mode: normalises with the batch's statistics
        out_a = bn(torch.cat([s, torch.zeros(1, 6)]))[0]  # one zero mate
        out_b = bn(other_batch)[0]  # three large random mates
        contrast[impl] = {
            "zero_mate": out_a.tolist(),
            "random_mates": out_b.tolist(),
            "identical": torch.allclose(out_a, out_b),
        }

    return {
        "chapter": CHAPTER,
        "lang": lang,
        "seed": seed,
        "x": x.tolist(),
        "gamma": GAMMA,
        "beta": BETA,
        "eps": EPS,
        "batch_mates": mates.tolist(),
        "output": {k: v.tolist() for k, v in y.items()},
        "x_hat_stats": {k: _x_hat_stats(v) for k, v in x_hats.items()},
        "max_abs_diff": {
            "manual_vs_torch": max_abs_diff(y["manual"], y["torch"]),
            "normlab_vs_torch": max_abs_diff(y["normlab"], y["torch"]),
            "normlab_vs_manual": max_abs_diff(y["normlab"], y["manual"]),
        },
        "allclose_atol_1e-6": {
            "manual_vs_torch": torch.allclose(y["manual"], y["torch"], atol=1e-6),
            "normlab_vs_torch": torch.allclose(y["normlab"], y["torch"], atol=1e-6),
            "normlab_vs_manual": torch.allclose(y["normlab"], y["manual"], atol=1e-6),
        },
        "batch_independence": independence,
        "batchnorm_train_contrast": contrast,
    }


def render(r: dict) -> str:
    """The chapter's printout (same rounding), with torch.nn's result beside normlab's."""
    lang = r.get("lang", "en")

    def t(text: str, **fields) -> str:
        return say(lang, text, **fields)

    out = [
        t("LayerNorm by hand vs normlab.nn.LayerNorm vs torch.nn.LayerNorm"),
        t("source: {chapter}", chapter=t(r["chapter"])),
        "",
        t("x = randn(4, 6) * 3.0 + 5.0 with seed {seed} (4 samples x 6 features):", seed=r["seed"]),
        *("    " + fmt(row, 2) for row in r["x"]),
        f"gamma = {r['gamma']}   beta = {r['beta']}   eps = {r['eps']}",
        "",
        t("output (gamma * x_hat + beta):"),
    ]
    rows = []
    for impl in ("manual", *IMPLS):
        for i, row in enumerate(r["output"][impl]):
            rows.append([t(LABEL[impl]) if impl == "manual" and i == 0 else LABEL[impl] if i == 0 else "", fmt(row, 3)])
    out.append(table(rows))
    out += ["", t("x_hat (before the affine): per row mean 0 and std 1, column means anything:")]
    rows = []
    for key, label, nd in (("row_mean", "row mean", 4), ("row_std", "row std", 4),
                           ("col_mean", "column mean", 3)):
        for j, impl in enumerate(("manual", *IMPLS)):
            # + 0.0 after rounding: a tiny negative mean prints as 0.0, not -0.0
            vals = [round(v, nd) + 0.0 for v in r["x_hat_stats"][impl][key]]
            rows.append([t(label) if j == 0 else "", LABEL[impl], fmt(vals, nd)])
    out.append(table(rows))
    tiny = max(abs(v) for impl in ("manual", *IMPLS) for v in r["x_hat_stats"][impl]["row_mean"])
    out.append(t("  (row means: largest |mean| {tiny:.1e}, float32 rounding; the chapter prints\n"
                 "   them as -0.0: a tiny negative number rounded to 4 decimals keeps its sign)", tiny=tiny))
    d, ok = r["max_abs_diff"], r["allclose_atol_1e-6"]
    out += [
        "",
        table([
            [t("manual vs torch.nn"), str(ok["manual_vs_torch"]), repr(d["manual_vs_torch"])],
            [t("normlab vs torch.nn"), str(ok["normlab_vs_torch"]), repr(d["normlab_vs_torch"])],
            [t("normlab vs manual"), str(ok["normlab_vs_manual"]), repr(d["normlab_vs_manual"])],
        ], header=[t("comparison"), "allclose(atol=1e-6)", t("max abs difference")]),
        "",
        t("the third sample alone vs inside a batch with 3 random mates (randn(3, 6) * 10.0):"),
    ]
    rows = []
    for key, label in (("alone", "alone"), ("in_batch", "in a batch"), ("identical", "identical?")):
        for j, impl in enumerate(IMPLS):
            v = r["batch_independence"][impl][key]
            rows.append([t(label) if j == 0 else "", f"{LABEL[impl]}.LayerNorm",
                         str(v) if key == "identical" else fmt(v, 3)])
    out.append(table(rows))
    out += ["", t("contrast: BatchNorm1d(6) in train mode, the same sample in two batches:")]
    rows = []
    for key, label in (("zero_mate", "one zero mate"), ("random_mates", "3 random mates"),
                       ("identical", "identical?")):
        for j, impl in enumerate(IMPLS):
            v = r["batchnorm_train_contrast"][impl][key]
            rows.append([t(label) if j == 0 else "", f"{LABEL[impl]}.BatchNorm1d",
                         str(v) if key == "identical" else fmt(v, 3)])
    out.append(table(rows))
    return "\n".join(out)
