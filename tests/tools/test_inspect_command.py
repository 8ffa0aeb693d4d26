"""``normlab inspect`` when the model cannot be had or the input cannot be made: a model file
with a syntax error, a module that fails while importing, a factory that raises, a factory that
needs arguments (``torch.nn:LayerNorm``), an ``--input-shape`` far beyond the memory, an input
the model refuses. Each is one line on stderr (what failed, where, what to do), exit status 1,
no traceback -- and nothing allocated for the oversized input."""

from __future__ import annotations

import subprocess
import sys

import pytest

from normlab import cli

FILES = {
    "syntax.py": "import torch\n\ndef build(:\n    return torch.nn.LayerNorm(4)\n",
    "importing.py": "import torch\n\nWEIGHTS = {}['resnet']\n\ndef build():\n    return torch.nn.LayerNorm(4)\n",
    "raising.py": "import torch\n\n\ndef build():\n    raise RuntimeError('no checkpoint at ./ckpt.pt')\n",
    "model.py": "import torch\n\n\ndef build():\n    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))\n",
}


def _inspect(tmp_path, monkeypatch, capsys, *argv) -> tuple[int, str]:
    monkeypatch.chdir(tmp_path)
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    try:
        status = cli.main(["inspect", *argv])
    except SystemExit as e:  # as the process ends: a message is status 1, printed on stderr
        status = 1 if isinstance(e.code, str) else e.code
        sys.stderr.write(f"{e.code}\n" if isinstance(e.code, str) else "")
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return status, lines[0]


@pytest.mark.parametrize("target, shape, says", [
    ("syntax.py:build", "4,4", ["normlab inspect:", "syntax.py line 3 has a syntax error", "fix the file"]),
    ("importing.py:build", "4,4", ["normlab inspect: importing 'importing.py' raised KeyError: 'resnet'",
                                   "(importing.py line 3)", "fix the module"]),
    ("raising.py:build", "4,4", ["normlab inspect: raising.py:build() raised RuntimeError: no checkpoint at ./ckpt.pt",
                                 "(raising.py line 5)", "fix the factory"]),
    ("torch.nn:LayerNorm", "4,4", ["normlab inspect: torch.nn:LayerNorm needs arguments (normalized_shape)",
                                   "def build(): return torch.nn.LayerNorm(...)", "normlab inspect models.py:build"]),
    ("model.py:build", "4,5", ["normlab inspect: the model failed on example_input of shape [4, 5]",
                               "mat1 and mat2", "--input-shape N,C,H,W"]),
])
def test_a_model_that_cannot_be_had_is_one_line(tmp_path, monkeypatch, capsys, target, shape, says):
    status, line = _inspect(tmp_path, monkeypatch, capsys, target, "--input-shape", shape)
    assert status == 1
    for s in says:
        assert s in line, (s, line)


def test_an_input_beyond_the_memory_is_refused_before_allocating(tmp_path, monkeypatch, capsys):
    # 1000 x 1000 x 1000 x 300 float32: 1.2 TB, which no test machine has (the allocation would
    # fail or be killed; the check names the size and the memory there is, and allocates nothing)
    status, line = _inspect(tmp_path, monkeypatch, capsys, "model.py:build", "--input-shape", "1000,1000,1000,300")
    assert status == 1
    assert line.startswith("normlab inspect: --input-shape 1000,1000,1000,300 is 1.2 TB of float32, more than half")
    assert "GB of memory available" in line and "small example" in line


def test_a_syntax_error_in_a_real_process(tmp_path):
    (tmp_path / "syntax.py").write_text(FILES["syntax.py"])
    p = subprocess.run([sys.executable, "-m", "normlab", "inspect", "syntax.py:build", "--input-shape", "4,4"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert p.returncode == 1 and p.stdout == "" and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip().endswith("syntax.py line 3 has a syntax error (invalid syntax); fix the file and run again")
