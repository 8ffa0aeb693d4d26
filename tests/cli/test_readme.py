"""The README's and the docs' snippets as a newcomer pastes them: each runs on its own
(every name defined), and the "30 seconds" example shows that the conversion happened.
The two set-up commands stay exactly as they are; one install story before them, the same
words in the README and in Getting started: where the CPU build of torch comes from, the
command for it, and the install time measured."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "NORMLAB_BACKEND": "ref"}
SETUP = [
    'python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install --no-build-isolation '
    '".[experiments]" && normlab experiment stability --quick && normlab report --out normlab-report',
    'python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install --no-build-isolation '
    '".[test]" && pytest',
]


def _blocks(path: Path, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", path.read_text(), flags=re.S)


def _run(code: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=ENV,
                          timeout=300)


def test_thirty_seconds_example_shows_the_conversion(tmp_path):
    (code,) = _blocks(ROOT / "README.md", "python")
    p = _run(code, tmp_path)
    assert p.returncode == 0, p.stderr
    assert "<class 'normlab.nn.batch_norm.BatchNorm1d'>" in p.stdout


def test_register_conversion_snippet_runs_as_pasted(tmp_path):
    (code,) = [b for b in _blocks(ROOT / "docs" / "layers.md", "python") if "register_conversion" in b]
    p = _run(code, tmp_path)
    assert p.returncode == 0, p.stderr
    assert "<class 'normlab.nn.layer_norm.LayerNorm2d'>" in p.stdout


def _story(path: Path) -> str:
    text = path.read_text()
    start = text.index("**Which torch.**")
    return text[start:text.index("\n\n", start)]


def test_setup_commands_unchanged_and_cpu_wheel_index_named():
    readme = (ROOT / "README.md").read_text()
    commands = [b.strip() for b in _blocks(ROOT / "README.md", "bash")]
    assert commands[:2] == SETUP
    assert "shared/seeds" not in readme and "docs/chapters/source.md" in readme
    ignored = (ROOT / ".gitignore").read_text().split()
    assert "normlab-runs/" in ignored and "normlab-report/" in ignored


def test_one_install_story_in_the_readme_and_getting_started():
    story = _story(ROOT / "README.md")
    assert _story(ROOT / "docs" / "getting-started.md") == story
    flat = " ".join(story.split())
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in flat
    assert "On Linux x86-64 that is PyTorch's CUDA build" in flat and "4 minutes on a loaded one" in flat
    for page in (ROOT / "README.md", ROOT / "docs" / "getting-started.md"):
        text = page.read_text()
        assert [b.strip() for b in _blocks(page, "bash")][:2] == SETUP, page
        assert text.index("**Which torch.**") < text.index(SETUP[0]), page      # read before running
        assert "so that pip takes the CPU build" not in text, page


def test_torchscript_snippet_runs_as_pasted(tmp_path):
    """normlab's modules do not script (TorchScript stops at their fast path's Python); the
    layers page shows the way that works, and it must keep working."""
    (code,) = [b for b in _blocks(ROOT / "docs" / "layers.md", "python") if "torch.jit.script" in b]
    p = _run(code, tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["RecursiveScriptModule", "torch.Size([3,", "8])"]
