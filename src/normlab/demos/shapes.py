"""``normlab demo shapes``: ``LayerNorm(d_model)`` on a ``[batch, seq_len, d_model]`` tensor.

Source: the LayerNorm answer (``normlab.demos.SOURCES``): ``x = torch.randn(32, 10, 512)``
through ``LayerNorm(512, eps=1e-5)``; the shapes of the input, the output, gamma
(``weight``) and beta (``bias``), which are ``[d_model]``. Added here: every
``(sample, position)`` row of the output has mean 0 and std 1, one sample gives
the same output at batch size 1 as inside the batch of 32 (batch size 1 works),
and normlab matches torch.nn. The chapter seeds nothing and prints no numbers, so
the seed here is an option.
"""

from __future__ import annotations

import argparse

import torch

from .. import nn as nl
from ._lang import add_lang_argument, check_lang, say
from . import source_label
from ._report import max_abs_diff, table

CHAPTER = source_label("answer", "nn.LayerNorm(d_model)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=0, help="seed of the random input (default 0)")
    def sample(text: str) -> int:
        i = int(text)
        if not 0 <= i < 32:
            raise argparse.ArgumentTypeError(f"expected a sample index in 0..31, got {i}")
        return i

    parser.add_argument("--sample", type=sample, default=7,
                        help="which of the 32 samples to run alone at batch size 1 (default 7)")
    add_lang_argument(parser)


@torch.no_grad()
def run(seed: int = 0, sample: int = 7, batch_size: int = 32, seq_len: int = 10,
        d_model: int = 512, lang: str = "en") -> dict:
    """Shapes of ``LayerNorm(d_model)`` on ``[batch_size, seq_len, d_model]``, and batch-size-1 behaviour
    (``lang``: the language ``render`` explains in, ``en`` or ``id``)."""
    check_lang(lang)
    if not 0 <= sample < batch_size:
        raise ValueError(f"demo shapes: expected 0 <= sample < {batch_size}, got sample={sample}")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch_size, seq_len, d_model, generator=g)
    res = {"chapter": CHAPTER, "lang": lang, "seed": seed, "sample": sample,
           "batch_size": batch_size, "seq_len": seq_len, "d_model": d_model}
    outs = {}
    for impl, cls in (("normlab", nl.LayerNorm), ("torch", torch.nn.LayerNorm)):
        ln = cls(d_model, eps=1e-5)
        y = ln(x)
        one = ln(x[sample:sample + 1])  # the same sample, batch size 1
        outs[impl] = y
        res[impl] = {
            "input_shape": list(x.shape),
            "output_shape": list(y.shape),
            "weight_shape": list(ln.weight.shape),
            "bias_shape": list(ln.bias.shape),
            "batch1_output_shape": list(one.shape),
            "max_abs_row_mean": y.mean(dim=-1).abs().max().item(),
            "max_abs_row_std_minus_1": (y.std(dim=-1, unbiased=False) - 1).abs().max().item(),
            "batch1_vs_full_batch_max_abs_diff": max_abs_diff(one[0], y[sample]),
            "batch1_equals_full_batch": torch.allclose(one[0], y[sample]),
        }
    res["normlab_vs_torch_max_abs_diff"] = max_abs_diff(outs["normlab"], outs["torch"])
    res["normlab_allclose_torch"] = torch.allclose(outs["normlab"], outs["torch"], atol=1e-6)
    return res


def _size(shape: list[int]) -> str:
    return f"torch.Size({shape})"


def render(r: dict) -> str:
    """The chapter's four shape lines, then the per-row statistics and the batch-size-1 check."""
    b, t, d = r["batch_size"], r["seq_len"], r["d_model"]
    lang = r.get("lang", "en")

    def tr(text: str, **fields) -> str:
        return say(lang, text, **fields)

    rows = []
    for key, label in (("input_shape", "Input shape"), ("output_shape", "Output shape"),
                       ("weight_shape", "Gamma shape (weight)"), ("bias_shape", "Beta shape (bias)"),
                       ("batch1_output_shape", "Output shape, sample {sample} alone")):
        rows.append([tr(label, sample=r["sample"]), _size(r["normlab"][key]), _size(r["torch"][key])])
    rows.append([tr("max |row mean| of the output"), f"{r['normlab']['max_abs_row_mean']:.2e}",
                 f"{r['torch']['max_abs_row_mean']:.2e}"])
    rows.append([tr("max |row std - 1| of the output"), f"{r['normlab']['max_abs_row_std_minus_1']:.2e}",
                 f"{r['torch']['max_abs_row_std_minus_1']:.2e}"])
    rows.append([tr("sample {sample}: batch size 1 == batch size {b}?", sample=r["sample"], b=b),
                 str(r["normlab"]["batch1_equals_full_batch"]), str(r["torch"]["batch1_equals_full_batch"])])
    rows.append([tr("  max abs difference"), repr(r["normlab"]["batch1_vs_full_batch_max_abs_diff"]),
                 repr(r["torch"]["batch1_vs_full_batch_max_abs_diff"])])
    return "\n".join([
        tr("LayerNorm(d_model) on [batch, seq_len, d_model] = [{b}, {t}, {d}]", b=b, t=t, d=d),
        tr("source: {chapter}", chapter=tr(r["chapter"])),
        tr("x = randn({b}, {t}, {d}) with seed {seed}; LayerNorm({d}, eps=1e-5)", b=b, t=t, d=d, seed=r["seed"]),
        "",
        table(rows, header=["", "normlab.nn.LayerNorm", "torch.nn.LayerNorm"]),
        "",
        tr("normlab vs torch.nn on the whole batch: allclose(atol=1e-6) {ok}, max abs difference {diff}",
           ok=r["normlab_allclose_torch"], diff=repr(r["normlab_vs_torch_max_abs_diff"])),
    ])
