"""``normlab bench``'s PNG: a run at one or two sizes (``--quick``) is one panel per mode with
a bar per provider and case, not a panel per case with a single column of dots; a run over
many sizes keeps GB/s against size. Read back as an image: its proportions say which."""

from __future__ import annotations

import matplotlib.image

from normlab.bench.cases import MODES, OPS
from normlab.bench.report import write_png

PROVIDERS = ("normlab-cpu", "torch", "compile", "limit")


def _rows(shapes: list[str]) -> list[dict]:
    return [{"op": op, "layout": "contiguous", "shape": shape, "dtype": "float32", "threads": 1, "mode": mode,
             "provider": p, "status": "ok", "gbps": 1.0 + i, "bytes": 4 * 2 ** (10 + j)}
            for op in OPS for j, shape in enumerate(shapes) for mode in MODES for i, p in enumerate(PROVIDERS)]


def _size(tmp_path, rows) -> tuple[int, int]:
    (path,) = write_png(rows, str(tmp_path))
    height, width = matplotlib.image.imread(path).shape[:2]
    return height, width


def test_a_run_at_one_size_is_one_panel_per_mode(tmp_path):
    height, width = _size(tmp_path, _rows(["4096x1024"]))
    # 8 ops x 3 modes as line panels would be 24 panels, 8 rows of 3 (about 2.0 x 8.3 in high)
    assert height < 1.5 * width


def test_a_run_over_many_sizes_is_gbps_against_size(tmp_path):
    height, width = _size(tmp_path, _rows(["4x6", "256x1024", "4096x1024"]))
    assert height > 1.5 * width          # a row of panels per op
