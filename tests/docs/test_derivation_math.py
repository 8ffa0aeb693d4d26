"""The derivation pages state their formulas as math (issue 25): no plain-text formula blocks
(only ```python code stays fenced, no indented code block), and every \\( ... \\) and $$ ... $$
converts to MathML as the site's build hook converts it (latex2mathml) without a stray
alignment '&' and with every row of an array. Each page also states its own result, in words
and as math."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONVERTED = ["layer_norm.md", "forward_mode.md", "batch_norm.md", "group_norm.md", "batch_norm_variants.md",
             "local_response_norm.md"]
DISPLAY = re.compile(r"^\$\$\n(.*?)\n\$\$$", re.S | re.M)
INLINE = re.compile(r"\\\((.*?)\\\)", re.S)
ARRAY = re.compile(r"\\begin\{array\}\{\w+\}(.*?)\\end\{array\}", re.S)
# What each page must say: a phrase of its prose (case-insensitive) and a piece of one of its
# formulas (LaTeX, spaces ignored) -- the result that page exists to derive.
STATES = {
    "layer_norm.md": ("no centring",  # RMSNorm: LayerNorm without the mean
                      r"\frac{\partial L}{\partial x_k} = r \left( g_k - \hat{x}_k \langle g \hat{x} \rangle \right)"),
    "forward_mode.md": ("mirror image of the backward",  # the tangent's three terms
                        r"d\hat{x} = r \left( t - \langle t \rangle - \hat{x} \langle \hat{x}\, t \rangle \right)"),
    "batch_norm.md": ("Bessel's correction",  # the running variance is the unbiased one
                      r"\hat\sigma^2 &\leftarrow (1 - m_t)\, \hat\sigma^2 + m_t\, \sigma_B^2\, \frac{m}{m - 1}"),
    "group_norm.md": ("statistics never cross groups",  # per-(sample, group) statistics over Cg * S values
                      r"m = C_g \cdot S"),
    "batch_norm_variants.md": ("constants of the backward",  # Renorm: BatchNorm with weight w r, bias w d + b
                               r"dw &= r\, dw' + d\, db'"),
    "local_response_norm.md": ("not the gradient of its own forward",  # torch's CrossMapLRN2d backward
                               r"\frac{\partial L}{\partial x_j} = g_j\, b_j^{-\beta} - \frac{2\alpha\beta}{n}\, x_j\, (M^\top r)_j"),
}


def _squash(s: str) -> str:
    return re.sub(r"\s+", "", s)


def _array_rows(latex: str) -> int:
    """Rows of the formula's arrays as LaTeX lays them out (a trailing \\\\ opens no row)."""
    count = 0
    for body in ARRAY.findall(latex):
        rows = re.split(r"\\\\", body)
        count += len(rows) - (not rows[-1].strip())
    return count


def _hooks():
    """The site's MkDocs hooks, docs/_tooling/mkdocs_hooks.py (they live with the docs, not in the package)."""
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "docs" / "_tooling" / "mkdocs_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", CONVERTED)
def test_derivation_formulas_are_math(name):
    pytest.importorskip("latex2mathml.converter")
    to_mathml = _hooks().to_mathml
    text = (ROOT / "docs" / "derivations" / name).read_text()
    fences = re.findall(r"^```(\w*)$", text, re.M)
    assert all(lang == "python" for lang in fences[::2]), f"{name}: plain-text formula block left: {fences}"
    no_fences = re.sub(r"^```python\n.*?^```$", "", text, flags=re.S | re.M)
    indented = re.findall(r"\n\n((?: {4}|\t).+)", no_fences)
    assert not indented, f"{name}: indented (plain-text) block left: {indented}"
    formulas = DISPLAY.findall(text) + INLINE.findall(DISPLAY.sub("", text))
    assert len(formulas) >= 10
    for f in formulas:
        html = to_mathml(f)
        assert "<mi>&amp;</mi>" not in html and "<mi>&</mi>" not in html, f
        assert html.count("<mtr") == _array_rows(f), f"{name}: rows of an array lost in MathML: {f}"
    phrase, formula = STATES[name]
    assert phrase.lower() in text.lower(), f"{name}: does not say {phrase!r}"
    assert any(_squash(formula) in _squash(f) for f in formulas), f"{name}: no formula states {formula!r}"
