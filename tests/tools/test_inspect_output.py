"""``normlab inspect`` fits the terminal it prints in: piped, $COLUMNS or 80 columns (not a
fixed 180); a table when it fits, else a block per layer; no word cut in two; every
abbreviation in a legend."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from normlab.tools.inspect_command import run
from normlab.tools.inspection_table import render

ROOT = Path(__file__).resolve().parents[2]
TARGET = "tests.tools.test_inspect:build_model"
WORDS = ["BatchNorm2d", "GroupNorm", "running statistics", "mom=0.1", "nbt=0", "initial 0/1", "statistics over"]


def _inspect(columns: str | None, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["NORMLAB_BACKEND"] = "ref"
    if columns:
        env["COLUMNS"] = columns
    return subprocess.run([sys.executable, "-m", "normlab.cli", "inspect", TARGET, "--input-shape", "4,3,6,6",
                           *extra], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


@pytest.mark.parametrize("columns,width", [(None, 80), ("80", 80), ("60", 60)])
def test_piped_output_fits_and_breaks_no_word(columns, width):
    p = _inspect(columns)
    assert p.returncode == 0 and "Traceback" not in p.stderr
    lines = p.stdout.splitlines()
    assert max(len(line) for line in lines) <= width
    for word in WORDS:
        assert word in p.stdout, word                     # whole, never "runnin" / "g"
    assert "…" not in p.stdout                            # nothing cut off either
    assert not any(line.startswith("┏") for line in lines)        # narrow: a block per layer


def test_wide_output_is_one_table():
    p = _inspect("220")
    assert p.returncode == 0
    lines = p.stdout.splitlines()
    assert any(line.startswith("┃ layer") for line in lines) and max(len(line) for line in lines) <= 220


def test_every_abbreviation_is_explained():
    text = render(run(TARGET, "4,3,6,6"), width=100)
    legend = text[text.index("legend:"):]
    for abbr in ("C = num_features", "G = num_groups", "shape = normalized_shape", "mom = momentum",
                 "tracks = track_running_stats", "nbt = num_batches_tracked", "var a..b", "initial 0/1",
                 "var≈0", "×N", "changes (d)", "same = no", "fails", "- = does not apply"):
        assert abbr in " ".join(legend.split()), abbr
