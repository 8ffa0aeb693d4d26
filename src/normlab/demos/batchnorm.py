"""``normlab demo batchnorm``: the BatchNorm chapter's ``batchnorm_train_eval.py``, live.

Source: the BatchNorm chapter (``normlab.demos.SOURCES``). Four parts, each
run with ``normlab.nn.BatchNorm1d`` and ``torch.nn.BatchNorm1d`` side by side:

1. anatomy of ``BatchNorm1d(3)``: gamma (``weight``), beta (``bias``), ``eps``,
   ``momentum`` and the initial running statistics;
2. train mode on a 4x3 batch: every column of the output has mean 0 and
   (biased) variance 1, and the running statistics move 10% (momentum 0.1)
   towards the batch mean and the *unbiased* batch variance;
3. batch dependence: the sample ``[2, 2, 2]`` gets different train-mode outputs
   in batches A and B, and the same eval-mode output alone or in batch B;
4. eval mode uses the running statistics, ``(x - running_mean) / sqrt(running_var + eps)``,
   then ``gamma * x_hat + beta`` once gamma/beta are changed.

No random numbers are drawn.
"""

from __future__ import annotations

import torch

from .. import nn as nl
from ._lang import add_lang_argument, check_lang, say
from . import source_label
from ._report import fmt, table

CHAPTER = source_label("batchnorm", "batchnorm_train_eval.py")
IMPLS = ("normlab", "torch")
LABEL = {"normlab": "normlab", "torch": "torch.nn"}


def _bn(impl: str, num_features: int = 3) -> torch.nn.Module:
    return (nl.BatchNorm1d if impl == "normlab" else torch.nn.BatchNorm1d)(num_features)


def _run_one(impl: str) -> dict:
    # 1. anatomy
    bn = _bn(impl)
    anatomy = {
        "weight": bn.weight.tolist(),
        "bias": bn.bias.tolist(),
        "eps": bn.eps,
        "momentum": bn.momentum,
        "running_mean": bn.running_mean.tolist(),
        "running_var": bn.running_var.tolist(),
    }

    # 2. train mode: the batch's own statistics, per channel
    x1 = torch.tensor([[1.0, 2.0, 3.0], [3.0, 4.0, 5.0], [5.0, 6.0, 7.0], [7.0, 8.0, 9.0]])
    y1 = bn(x1)
    train = {
        "output": y1.tolist(),
        "col_mean": y1.mean(dim=0).tolist(),
        "col_var": y1.var(dim=0, unbiased=False).tolist(),
        "running_mean": bn.running_mean.tolist(),
        "running_var": bn.running_var.tolist(),
    }

    # 3. one sample, three paths
    bn_new = _bn(impl)
    s = torch.tensor([[2.0, 2.0, 2.0]])
    batch_a = torch.cat([s, torch.zeros(1, 3), torch.full((1, 3), 4.0), torch.full((1, 3), 8.0)])
    batch_b = torch.cat([s, torch.full((1, 3), 10.0), torch.full((1, 3), 20.0), torch.full((1, 3), 30.0)])
    out_a = bn_new(batch_a)[0]
    out_b = bn_new(batch_b)[0]
    bn_new.eval()
    eval_alone = bn_new(s)[0]
    eval_in_b = bn_new(batch_b)[0]
    dependence = {
        "train_batch_a": out_a.tolist(),
        "train_batch_b": out_b.tolist(),
        "eval_alone": eval_alone.tolist(),
        "eval_in_batch_b": eval_in_b.tolist(),
        "eval_identical": torch.allclose(eval_alone, eval_in_b),
    }

    # 4. eval mode: running statistics, then gamma/beta
    bn.eval()
    s2 = torch.tensor([[2.0, 4.0, 6.0]])
    y_eval = bn(s2)
    manual = (s2 - bn.running_mean) / torch.sqrt(bn.running_var + bn.eps)
    bn.weight.copy_(torch.tensor([2.0, 1.0, 0.5]))
    bn.bias.copy_(torch.tensor([10.0, 0.0, -10.0]))
    y_affine = bn(s2)
    manual_affine = manual * bn.weight + bn.bias
    eval_mode = {
        "input": s2[0].tolist(),
        "output": y_eval[0].tolist(),
        "manual": manual[0].tolist(),
        "weight": bn.weight.tolist(),
        "bias": bn.bias.tolist(),
        "affine_output": y_affine[0].tolist(),
        "affine_manual": manual_affine[0].tolist(),
        "affine_match": torch.allclose(y_affine, manual_affine),
    }
    return {"anatomy": anatomy, "train": train, "batch_dependence": dependence, "eval": eval_mode}


def _max_diff(a, b) -> float:
    return (torch.tensor(a, dtype=torch.float64) - torch.tensor(b, dtype=torch.float64)).abs().max().item()


def add_arguments(parser) -> None:
    add_lang_argument(parser)


@torch.no_grad()
def run(lang: str = "en") -> dict:
    """Compute every number of ``batchnorm_train_eval.py`` with normlab and with torch.nn
    (``lang``: the language ``render`` explains in, ``en`` or ``id``)."""
    check_lang(lang)
    res = {impl: _run_one(impl) for impl in IMPLS}
    n, t = res["normlab"], res["torch"]
    pairs = {
        "train.output": (n["train"]["output"], t["train"]["output"]),
        "train.running_mean": (n["train"]["running_mean"], t["train"]["running_mean"]),
        "train.running_var": (n["train"]["running_var"], t["train"]["running_var"]),
        "batch_dependence.train_batch_a": (n["batch_dependence"]["train_batch_a"],
                                           t["batch_dependence"]["train_batch_a"]),
        "batch_dependence.train_batch_b": (n["batch_dependence"]["train_batch_b"],
                                           t["batch_dependence"]["train_batch_b"]),
        "batch_dependence.eval_alone": (n["batch_dependence"]["eval_alone"],
                                        t["batch_dependence"]["eval_alone"]),
        "eval.output": (n["eval"]["output"], t["eval"]["output"]),
        "eval.affine_output": (n["eval"]["affine_output"], t["eval"]["affine_output"]),
    }
    return {
        "chapter": CHAPTER,
        "lang": lang,
        **res,
        "max_abs_diff_normlab_vs_torch": {k: _max_diff(a, b) for k, (a, b) in pairs.items()},
    }


def render(r: dict) -> str:
    """The chapter's printout (same rounding), with torch.nn's result beside normlab's."""
    lang = r.get("lang", "en")

    def t(text: str, **fields) -> str:
        return say(lang, text, **fields)

    def rows_for(label: str, get, nd: int | None) -> list[list[str]]:
        rows = []
        for j, impl in enumerate(IMPLS):
            v = get(r[impl])
            rows.append([t(label) if j == 0 else "", LABEL[impl], str(v) if nd is None else fmt(v, nd)])
        return rows

    out = [t("BatchNorm1d: batch statistics, running statistics, train vs eval"),
           t("source: {chapter}", chapter=t(r["chapter"])), ""]

    out.append(t("1. anatomy of BatchNorm1d(3), freshly built:"))
    rows = []
    for key, label in (("weight", "gamma (weight)"), ("bias", "beta (bias)"), ("eps", "eps"),
                       ("momentum", "momentum"), ("running_mean", "running_mean"),
                       ("running_var", "running_var")):
        rows += rows_for(label, lambda d, k=key: d["anatomy"][k], None)
    out += [table(rows), ""]

    out.append(t("2. train mode on x1 = [[1, 2, 3], [3, 4, 5], [5, 6, 7], [7, 8, 9]]:"
                 " each column gets mean 0, variance 1"))
    rows = []
    for impl in IMPLS:
        for i, row in enumerate(r[impl]["train"]["output"]):
            rows.append([t("output") if (i == 0 and impl == "normlab") else "",
                         LABEL[impl] if i == 0 else "", fmt(row, 4)])
    rows += rows_for("column mean", lambda d: d["train"]["col_mean"], 4)
    rows += rows_for("column variance", lambda d: d["train"]["col_var"], 4)
    rows += rows_for("running_mean after", lambda d: d["train"]["running_mean"], 3)
    rows += rows_for("running_var after", lambda d: d["train"]["running_var"], 3)
    out += [table(rows),
            t("  (running_mean = 0.9 * 0 + 0.1 * [4, 5, 6]; running_var = 0.9 * 1 + 0.1 * 6.667,"
              " the unbiased batch variance)"), ""]

    out.append(t("3. one sample s = [2, 2, 2], three paths (A = s,0,4,8; B = s,10,20,30):"))
    rows = []
    rows += rows_for("train, in batch A", lambda d: d["batch_dependence"]["train_batch_a"], 4)
    rows += rows_for("train, in batch B", lambda d: d["batch_dependence"]["train_batch_b"], 4)
    rows += rows_for("eval, alone", lambda d: d["batch_dependence"]["eval_alone"], 4)
    rows += rows_for("eval, in batch B", lambda d: d["batch_dependence"]["eval_in_batch_b"], 4)
    rows += rows_for("eval identical?", lambda d: d["batch_dependence"]["eval_identical"], None)
    out += [table(rows), ""]

    out.append(t("4. eval mode on s2 = [2, 4, 6] (the layer trained on x1):"))
    rows = []
    rows += rows_for("eval output", lambda d: d["eval"]["output"], 4)
    rows += rows_for("(x - mu) / sqrt(var + eps)", lambda d: d["eval"]["manual"], 4)
    out += [table(rows),
            t("  after gamma = [2.0, 1.0, 0.5], beta = [10.0, 0.0, -10.0]:")]
    rows = []
    rows += rows_for("layer output", lambda d: d["eval"]["affine_output"], 4)
    rows += rows_for("manual g * x_hat + b", lambda d: d["eval"]["affine_manual"], 4)
    rows += rows_for("match?", lambda d: d["eval"]["affine_match"], None)
    out += [table(rows), ""]

    out.append(t("max |normlab - torch.nn|:"))
    out.append(table([[k, repr(v)] for k, v in r["max_abs_diff_normlab_vs_torch"].items()]))
    return "\n".join(out)
