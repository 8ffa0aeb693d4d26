"""The README's and the docs' snippets as a newcomer pastes them: each runs on its own
(every name defined), and the "30 seconds" example shows that the conversion happened.
The two set-up commands stay exactly as they are; the CPU wheel index is named beside them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "NORMLAB_BACKEND": "ref"}
SETUP = [
    'python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install --no-build-isolation . '
    '&& normlab experiment stability --quick && normlab report --out normlab-report',
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


def test_setup_commands_unchanged_and_cpu_wheel_index_named():
    readme = (ROOT / "README.md").read_text()
    commands = [b.strip() for b in _blocks(ROOT / "README.md", "bash")]
    assert commands[:2] == SETUP
    assert "--index-url https://download.pytorch.org/whl/cpu" in commands[2]
    assert "shared/seeds" not in readme and "docs/chapters/source.md" in readme
    ignored = (ROOT / ".gitignore").read_text().split()
    assert "normlab-runs/" in ignored and "normlab-report/" in ignored
