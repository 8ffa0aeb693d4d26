"""``normlab figures --out DIR``: the documentation's pictures, each from a live computation.

Every figure module has ``compute(...) -> dict`` (the numbers, from normlab's own layers and
experiments; what the tests check against torch.nn and hand derivations) and
``draw(data, path)`` (plain matplotlib, a title, labelled axes with units, a legend).

=================  ===================================================================
``norm_axes``      what BatchNorm, LayerNorm, InstanceNorm, GroupNorm normalise over
``saturation``     the chapter's MLP at lr 2.0: each Tanh's input over training
``batch_dependence``  one sample's output as its batch mates are replaced
``running_stats``  running mean/var against the population, momentum 0.1, 0.01, None
``stability_map``  the stability study: accuracy per norm x learning rate
=================  ===================================================================
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

FIGURES = {
    "norm_axes": "What each norm normalises over (N, C, H·W)",
    "saturation": "Inside the chapter's MLP at lr 2.0: Tanh inputs over training",
    "batch_dependence": "Batch dependence: one sample, its batch mates replaced",
    "running_stats": "Running statistics against the population, by momentum",
    "stability_map": "Stability: accuracy by norm and learning rate",
}


def check_out(out) -> Path:
    """The output folder, made ready before any work: an existing folder, or a new one (with
    its parents); a file there, or a place this user cannot write to, raises ValueError."""
    text = "" if out is None else str(out)
    if not text.strip():
        raise ValueError("normlab figures: --out must name a folder, got an empty path")
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"normlab figures: --out {text} exists and is not a folder; give a folder path")
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"normlab figures: --out {text} lies under {parent}, which is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):       # can this user write here?
            pass
    except OSError as e:
        raise ValueError(f"normlab figures: cannot write into --out {text}: {e.strerror or e}") from None
    return path


def parse_only(value) -> list[str]:
    names = [v.strip() for v in (value.split(",") if isinstance(value, str) else value) if v.strip()]
    unknown = [n for n in names if n not in FIGURES]
    if unknown or not names:
        raise ValueError(f"normlab figures: expected --only from {', '.join(FIGURES)}, got {value!r}")
    return names


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="folder to write the PNGs into (created if missing)")
    p.add_argument("--only", default=None, help=f"comma-separated subset of {','.join(FIGURES)} (default: all)")
    p.add_argument("--store", default=None,
                   help="SQLite store of the stability study (default: a fresh temporary one with the quick study); "
                        "runs already stored are read back, missing ones trained")


def _make(name: str, path: Path, store: str) -> None:
    import importlib

    mod = importlib.import_module(f"{__name__}.{name}")
    data = mod.compute(store) if name == "stability_map" else mod.compute()
    mod.draw(data, path)


def run(out=None, only=None, store: str | None = None) -> dict:
    """Draw the figures into ``out``; every argument is checked before any computation."""
    names = parse_only(only) if only is not None else list(FIGURES)
    if store is not None and Path(store).exists() and not Path(store).is_file():
        raise ValueError(f"normlab figures: --store {store} exists and is not a file")
    path = check_out(out)
    done = []
    with tempfile.TemporaryDirectory(prefix="normlab-figures-") as tmp:
        st = store or os.path.join(tmp, "runs.sqlite")
        for name in names:
            t0 = time.perf_counter()
            target = path / f"{name}.png"
            _make(name, target, st)
            done.append({"name": name, "title": FIGURES[name], "path": str(target),
                         "seconds": round(time.perf_counter() - t0, 2)})
    return {"out": str(path), "figures": done}


def render(r: dict) -> str:
    lines = [f"normlab figures: wrote {len(r['figures'])} PNG(s) into {r['out']}"]
    lines += [f"  {f['path']}  ({f['title']}; {f['seconds']:.1f} s)" for f in r["figures"]]
    return "\n".join(lines)
