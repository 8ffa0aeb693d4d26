"""Ctrl-C as a user presses it: a real SIGINT to a running ``normlab`` process. Whether it
comes while measuring or while the plots are drawn, the command keeps what it measured, says
so in a line, prints no traceback and exits 130 (128 + SIGINT), as the experiments do and as a
shell reports an interrupted command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.bench.files import csv_rows

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def test_ctrl_c_while_measuring_keeps_the_rows_and_exits_130(tmp_path):
    out = tmp_path / "bench"
    p = subprocess.Popen([sys.executable, "-m", "normlab", "bench", "--quick", "--ops", "layer_norm,rms_norm,group_norm",
                          "--providers", "torch,limit", "--out", str(out)], cwd=tmp_path, env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (out / "bench.csv").exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert p.poll() is None, "the run ended before the first group was written: no Ctrl-C to test"
        p.send_signal(signal.SIGINT)                     # Ctrl-C after the first group
        stdout, stderr = p.communicate(timeout=240)
    finally:
        p.kill()
    assert p.returncode == 130, (stdout[-2000:], stderr[-2000:])
    assert "Traceback" not in stderr, stderr
    assert "interrupted" in stdout + stderr
    assert csv_rows(out / "bench.csv")                   # what was measured is kept


DRAWING = """
import os, signal, sys
import matplotlib.figure
from normlab import cli

save = matplotlib.figure.Figure.savefig


def savefig(self, *args, **kwargs):  # the user presses Ctrl-C while a plot is being written
    os.kill(os.getpid(), signal.SIGINT)
    return save(self, *args, **kwargs)


matplotlib.figure.Figure.savefig = savefig
sys.exit(cli.main(sys.argv[1:]))
"""


def test_ctrl_c_while_drawing_the_plots_is_one_line_and_exits_130(tmp_path):
    out = tmp_path / "bench"
    p = subprocess.run([sys.executable, "-c", DRAWING, "bench", "--quick", "--ops", "layer_norm", "--sizes", "4x6",
                        "--modes", "forward", "--providers", "torch,limit", "--out", str(out)],
                       cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert p.returncode == 130, (p.stdout[-2000:], p.stderr[-2000:])
    assert "Traceback" not in p.stderr, p.stderr
    assert "interrupted while drawing the plots" in p.stdout + p.stderr
    assert csv_rows(out / "bench.csv") and (out / "bench.json").is_file()
