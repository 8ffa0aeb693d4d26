"""``normlab compare``: BatchNorm1d vs LayerNorm, every cell of the table measured live.

Source: the closing "BatchNorm vs LayerNorm" section of the LayerNorm chapter
(and the batch-dependence part of the BatchNorm chapter; ``normlab.demos.SOURCES``). For an
``(N, D)`` input the two layers are probed, not described:

- statistics axis: which axis of the output ends up with mean 0 and variance 1
  (dim 0 = each feature over the batch, dim 1 = each sample over its features);
- batch dependence, in train and in eval mode: does the output of one sample
  change when its batch mates are replaced?
- batch size 1, in train and in eval mode: call the layer on one sample
  (BatchNorm in train mode raises, as it has one value per channel);
- running statistics: the layer's buffers, and whether a train-mode call moves them;
- parameter shapes: ``named_parameters()``;
- typical use: text, from the chapter.

The same probes run on ``torch.nn``'s layers; the report says whether every cell agrees.
``--lang id`` explains in Bahasa Indonesia (``_lang``); ``run``'s results do not change.
"""

from __future__ import annotations

import torch

from .. import nn as nl
from . import source_label
from ._lang import add_lang_argument, check_lang, say
from ._report import table, yes_no

CHAPTER = source_label("layernorm", "closing comparison")
LAYERS = ("BatchNorm1d", "LayerNorm")
IMPLS = ("normlab", "torch")
TYPICAL_USE = {
    "BatchNorm1d": "CNNs, batches of tens-hundreds",
    "LayerNorm": "transformers, RNNs (sequences)",
}
ROWS = (
    ("stats_axis", "statistics axis (mean 0, var 1)"),
    ("depends_train", "output depends on batch mates (train)"),
    ("depends_eval", "output depends on batch mates (eval)"),
    ("batch1_train", "works at batch size 1 (train)"),
    ("batch1_eval", "works at batch size 1 (eval)"),
    ("running_stats", "keeps running statistics"),
    ("params", "parameter shapes"),
    ("typical_use", "typical use"),
)


def add_arguments(parser) -> None:
    add_lang_argument(parser)


def _make(impl: str, layer: str, d: int) -> torch.nn.Module:
    ns = nl if impl == "normlab" else torch.nn
    return getattr(ns, layer)(d)


def _mean0_var1(y: torch.Tensor, dim: int) -> bool:
    return bool(torch.allclose(y.mean(dim=dim), torch.zeros(()), atol=1e-4)
                and torch.allclose(y.var(dim=dim, unbiased=False), torch.ones(()), atol=1e-3))


def _try(layer: torch.nn.Module, x: torch.Tensor) -> dict:
    try:
        layer(x)
    except Exception as e:  # noqa: BLE001 - the exception is the measurement
        return {"works": False, "error": f"{type(e).__name__}: {e}"}
    return {"works": True, "error": None}


def _probe(impl: str, layer: str, x: torch.Tensor, other_mates: torch.Tensor) -> dict:
    d = x.shape[1]
    s, mates = x[:1], x[1:1 + other_mates.shape[0]]

    y = _make(impl, layer, d)(x)  # fresh layer, train mode, identity affine
    dim0, dim1 = _mean0_var1(y, 0), _mean0_var1(y, 1)
    axis = 0 if dim0 and not dim1 else 1 if dim1 and not dim0 else None

    def change(train: bool) -> float:
        m = _make(impl, layer, d)
        if not train:
            m(x)  # one train-mode step so that eval uses non-trivial running statistics
            m.eval()
        a = m(torch.cat([s, mates]))[0]
        b = m(torch.cat([s, other_mates]))[0]
        return (a - b).abs().max().item()

    change_train, change_eval = change(True), change(False)
    m_train = _make(impl, layer, d)
    m_eval = _make(impl, layer, d)
    m_eval(x)
    m_eval.eval()

    m = _make(impl, layer, d)
    before = {k: v.clone() for k, v in m.named_buffers()}
    m(x)
    moved = any(not torch.equal(v, dict(m.named_buffers())[k]) for k, v in before.items())
    return {
        "dim0_mean0_var1": dim0,
        "dim1_mean0_var1": dim1,
        "stats_axis": axis,
        "max_change_train": change_train,
        "depends_on_batch_train": change_train > 1e-6,
        "max_change_eval": change_eval,
        "depends_on_batch_eval": change_eval > 1e-6,
        "batch_size_1_train": _try(m_train, s),
        "batch_size_1_eval": _try(m_eval, s),
        "buffers": {k: list(v.shape) for k, v in before.items()},
        "running_stats_updated_in_train": moved,
        "parameters": {k: list(p.shape) for k, p in m.named_parameters()},
    }


def _cells(p: dict, layer: str) -> dict:
    """The table's cells (plain strings) for one probe result."""
    axis = {0: "dim 0 (per feature, over batch)", 1: "dim 1 (per sample, over features)",
            None: "neither axis"}[p["stats_axis"]]

    def works(t: dict) -> str:
        return "yes" if t["works"] else f"no ({t['error'].split(':')[0]})"

    stats = [k for k in p["buffers"] if k.startswith("running_")]
    return {
        "stats_axis": axis,
        "depends_train": yes_no(p["depends_on_batch_train"]),
        "depends_eval": yes_no(p["depends_on_batch_eval"]),
        "batch1_train": works(p["batch_size_1_train"]),
        "batch1_eval": works(p["batch_size_1_eval"]),
        "running_stats": (f"yes: {', '.join(stats)}" if stats and p["running_stats_updated_in_train"]
                          else "no buffers" if not p["buffers"] else "buffers, not updated"),
        "params": ", ".join(f"{k} {v}" for k, v in p["parameters"].items()) or "none",
        "typical_use": TYPICAL_USE[layer],
    }


@torch.no_grad()
def run(seed: int = 0, n_samples: int = 8, n_features: int = 6, lang: str = "en") -> dict:
    """Probe normlab's and torch.nn's BatchNorm1d and LayerNorm on an ``(n_samples, n_features)`` input
    (``lang``: the language ``render`` explains in, ``en`` or ``id``)."""
    check_lang(lang, "normlab compare")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_samples, n_features, generator=g) * 3.0 + 5.0
    other_mates = torch.randn(3, n_features, generator=g) * 10.0
    res = {"chapter": CHAPTER, "seed": seed, "input_shape": [n_samples, n_features], "lang": lang}
    cells = {}
    for impl in IMPLS:
        res[impl] = {layer: _probe(impl, layer, x, other_mates) for layer in LAYERS}
        cells[impl] = {layer: _cells(res[impl][layer], layer) for layer in LAYERS}
    res["table"] = {key: {layer: cells["normlab"][layer][key] for layer in LAYERS} for key, _ in ROWS}
    res["differences_from_torch"] = [
        f"{layer} / {key}: normlab {cells['normlab'][layer][key]!r}, torch.nn {cells['torch'][layer][key]!r}"
        for layer in LAYERS for key, _ in ROWS if cells["normlab"][layer][key] != cells["torch"][layer][key]
    ]
    res["differences"] = [
        {"layer": layer, "row": key, "normlab": cells["normlab"][layer][key], "torch": cells["torch"][layer][key]}
        for layer in LAYERS for key, _ in ROWS if cells["normlab"][layer][key] != cells["torch"][layer][key]
    ]
    res["same_as_torch"] = not res["differences_from_torch"]
    return res


def _cell(lang: str, key: str, text: str) -> str:
    """One table cell (as ``_cells`` wrote it in English) in ``lang``; names of code stay."""
    if lang == "en" or key == "params" and text != "none":
        return text
    if text.startswith("no (") and text.endswith(")"):
        return say(lang, "no ({error})", error=text[4:-1])
    if text.startswith("yes: "):
        return say(lang, "yes: {names}", names=text[5:])
    return say(lang, text)


def render(r: dict) -> str:
    lang = r.get("lang", "en")

    def t(text: str, **fields) -> str:
        return say(lang, text, **fields)

    n, d = r["input_shape"]
    lines = [
        t("BatchNorm1d vs LayerNorm, measured on an ({n}, {d}) input", n=n, d=d),
        t("source: {chapter}", chapter=t(r["chapter"])),
        "",
        table([[t(label), *(_cell(lang, key, r["table"][key][layer]) for layer in LAYERS)] for key, label in ROWS],
              header=["", "normlab.nn.BatchNorm1d", "normlab.nn.LayerNorm"]),
        "",
    ]
    for layer in LAYERS:
        p = r["normlab"][layer]
        lines.append(t("  {layer}: largest change of one sample's output when its batch mates are replaced: "
                       "train {train}, eval {eval}", layer=layer, train=f"{p['max_change_train']:.3g}",
                       eval=f"{p['max_change_eval']:.3g}"))
        for mode in ("train", "eval"):
            err = p[f"batch_size_1_{mode}"]["error"]
            if err:
                lines.append(t("  {layer} at batch size 1 in {mode} mode raised {error}", layer=layer, mode=mode,
                               error=err))
    lines.append("")
    if r["same_as_torch"]:
        lines.append(t("torch.nn.BatchNorm1d and torch.nn.LayerNorm, probed the same way, give every cell the same."))
    else:
        lines.append(t("torch.nn differs:"))
        rows = dict(ROWS)
        lines += [t("  {layer} / {row}: normlab {ours}, torch.nn {theirs}", layer=x["layer"],
                    row=t(rows[x["row"]]), ours=repr(_cell(lang, x["row"], x["normlab"])),
                    theirs=repr(_cell(lang, x["row"], x["torch"]))) for x in r.get("differences", [])]
    return "\n".join(lines)
