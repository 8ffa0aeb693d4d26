"""The derivation pages state their formulas as math (issue 25): no plain-text formula blocks
(only ```python code stays fenced), and every \\( ... \\) and $$ ... $$ converts to MathML
with latex2mathml (what the site's build hook does) without a stray alignment '&'."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONVERTED = ["layer_norm.md", "forward_mode.md"]
DISPLAY = re.compile(r"^\$\$\n(.*?)\n\$\$$", re.S | re.M)
INLINE = re.compile(r"\\\((.*?)\\\)", re.S)


@pytest.mark.parametrize("name", CONVERTED)
def test_derivation_formulas_are_math(name):
    convert = pytest.importorskip("latex2mathml.converter").convert
    text = (ROOT / "docs" / "derivations" / name).read_text()
    fences = re.findall(r"^```(\w*)$", text, re.M)
    assert all(lang == "python" for lang in fences[::2]), f"{name}: plain-text formula block left: {fences}"
    formulas = DISPLAY.findall(text) + INLINE.findall(DISPLAY.sub("", text))
    assert len(formulas) >= 10
    for f in formulas:
        html = convert(f)
        assert "<mi>&amp;</mi>" not in html and "<mi>&</mi>" not in html, f
    # the derivation's statements, as math now: the three-term dx and the RMSNorm/forward results
    assert "no centring" in text.lower() or "no mean" in text.lower()
