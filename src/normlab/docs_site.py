"""``normlab docs build|serve``: MkDocs on the documentation site of a checkout of normlab.

The site's sources (``mkdocs.yml``, ``docs/``, and its build tooling in ``docs/_tooling/``:
the MkDocs hooks and the griffe extension) live in the repository, not in the installed
package: run the commands from the checkout's root, or pass ``--config-file``. The build
draws the figures (``normlab figures``) and executes the chapter pages. :data:`build` and
:data:`serve` are the two commands (``run``, ``render``, ``add_arguments``).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace


def check(config_file: str) -> Path:
    """The mkdocs.yml to build, and mkdocs itself, checked before any work."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        raise ValueError("normlab docs: mkdocs and its theme are not installed; "
                         "install the docs extra from a checkout of normlab: pip install --no-build-isolation '.[docs]'")
    cfg = Path(config_file)
    if not cfg.is_file():
        raise ValueError(f"normlab docs: no {config_file} here ({Path.cwd()}); the site builds from a checkout of "
                         "normlab's source (mkdocs.yml, docs/), not from the installed package: run this in the "
                         "checkout's root or pass --config-file PATH/mkdocs.yml")
    return cfg


def _config_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config-file", default="mkdocs.yml", help="the site's mkdocs.yml (default ./mkdocs.yml)")


def _build_arguments(p: argparse.ArgumentParser) -> None:
    _config_argument(p)
    p.add_argument("--site-dir", default=None, help="output folder (default: site/ beside mkdocs.yml)")


def run_build(config_file: str = "mkdocs.yml", site_dir: str | None = None) -> dict:
    """``mkdocs build --strict`` of ``config_file`` into ``site_dir`` (default: ``site/`` beside it)."""
    cfg = check(config_file)
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(cfg)]
    if site_dir:
        cmd += ["-d", str(Path(site_dir).resolve())]
    rc = subprocess.call(cmd)
    if rc:
        raise ValueError(f"normlab docs: mkdocs build --strict failed (exit {rc}); its messages are above")
    out = Path(site_dir) if site_dir else cfg.parent / "site"
    return {"site": str(out), "index": str(out / "index.html")}


def _serve_arguments(p: argparse.ArgumentParser) -> None:
    _config_argument(p)
    p.add_argument("--addr", default="127.0.0.1:8000", help="address to serve on (default 127.0.0.1:8000)")


def run_serve(config_file: str = "mkdocs.yml", addr: str = "127.0.0.1:8000") -> dict:
    """``mkdocs serve`` of ``config_file`` on ``addr``, rebuilt when a page changes; returns when stopped."""
    cfg = check(config_file)
    rc = subprocess.call([sys.executable, "-m", "mkdocs", "serve", "-f", str(cfg), "-a", addr])
    return {"addr": addr, "exit": rc}


#: ``normlab docs build``
build = SimpleNamespace(
    add_arguments=_build_arguments, run=run_build,
    render=lambda r: f"normlab docs: built the site into {r['site']} (open {r['index']})")
#: ``normlab docs serve``
serve = SimpleNamespace(
    add_arguments=_serve_arguments, run=run_serve,
    render=lambda r: f"normlab docs: the server on {r['addr']} stopped (exit {r['exit']})")
