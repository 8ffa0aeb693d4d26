"""``normlab docs build``: the documentation site, ``mkdocs build --strict``, into ``site/``.

The site's sources (``mkdocs.yml``, ``docs/``) live in the repository, not in the
installed package: run the command from the repository root, or pass ``--config-file``.
The build draws the figures (``normlab figures``) and executes the chapter pages.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path


def check(config_file: str) -> Path:
    """The mkdocs.yml to build, and mkdocs itself, checked before any work."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        raise ValueError("normlab docs: mkdocs and its theme are not installed; "
                         "install the docs extra: pip install '.[docs]'")
    cfg = Path(config_file)
    if not cfg.is_file():
        raise ValueError(f"normlab docs: no {config_file} here ({Path.cwd()}); run from the repository root "
                         "or pass --config-file PATH/mkdocs.yml")
    return cfg


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config-file", default="mkdocs.yml", help="the site's mkdocs.yml (default ./mkdocs.yml)")
    p.add_argument("--site-dir", default=None, help="output folder (default: site/ beside mkdocs.yml)")


def run(config_file: str = "mkdocs.yml", site_dir: str | None = None) -> dict:
    cfg = check(config_file)
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(cfg)]
    if site_dir:
        cmd += ["-d", str(Path(site_dir).resolve())]
    rc = subprocess.call(cmd)
    if rc:
        raise ValueError(f"normlab docs: mkdocs build --strict failed (exit {rc}); its messages are above")
    out = Path(site_dir) if site_dir else cfg.parent / "site"
    return {"site": str(out), "index": str(out / "index.html")}


def render(r: dict) -> str:
    return f"normlab docs: built the site into {r['site']} (open {r['index']})"
