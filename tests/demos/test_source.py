"""Every demo names its source chapter and points to a page that describes the chapters in
normlab's own words (docs/chapters/source.md), never to a file a user does not have; the
LayerNorm demo leaves no cell blank and prints no -0.0."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from normlab.demos import SOURCE_PAGE, SOURCES

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "NORMLAB_BACKEND": "ref"}
COMMANDS = [["demo", "layernorm"], ["demo", "batchnorm"], ["demo", "shapes"], ["compare"],
            ["demo", "layernorm", "--lang", "id"]]


def _normlab(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "normlab.cli", *argv], capture_output=True, text=True, env=ENV,
                          timeout=300)


@pytest.fixture(scope="module")
def outputs() -> dict:
    return {" ".join(a): _normlab(*a) for a in COMMANDS}


@pytest.mark.parametrize("argv", [" ".join(a) for a in COMMANDS])
def test_demo_points_to_the_source_page(outputs, argv):
    p = outputs[argv]
    assert p.returncode == 0 and "Traceback" not in p.stderr
    line = p.stdout.splitlines()[1]
    if "--lang id" in argv:  # the label in Indonesian too (issue 36: "sumber: BatchNorm chapter, ... (see ...)")
        assert line.startswith("sumber: bab ") and f"(lihat {SOURCE_PAGE})" in line
    else:
        assert line.startswith("source: ") and f"(see {SOURCE_PAGE})" in line
        assert any(name.removeprefix("the ") in line for name, _ in SOURCES.values())
    assert "seeds/" not in p.stdout and ".txt" not in p.stdout
    assert len(line) <= 80


def test_the_source_page_describes_every_chapter():
    page = (ROOT / SOURCE_PAGE).read_text()
    for name, _ in SOURCES.values():
        assert name.split(" ", 1)[1] in page            # "LayerNorm chapter", ...
    # the numbers the chapters printed, quoted as facts
    for number in ("0.877", "0.520", "[32, 10, 512]", "1.135"):
        assert number in page
    assert "seeds/" not in page and "_846f934512a29b05" not in page
    assert "chapters/source.md" in (ROOT / "mkdocs.yml").read_text()


def test_layernorm_demo_has_no_blank_cell_and_no_negative_zero(outputs):
    text = outputs["demo layernorm"].stdout
    assert "-0.0," not in text and "-0.0]" not in text.replace("as -0.0", "")
    assert re.search(r"normlab vs manual\s+True\s+\d", text)       # the allclose cell is filled
    assert "the chapter prints" in text                              # and the chapter's -0.0 is explained
