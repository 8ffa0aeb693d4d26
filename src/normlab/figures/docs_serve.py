"""``normlab docs serve``: the documentation site on a local web server (``mkdocs serve``),
rebuilt when a page changes."""

from __future__ import annotations

import argparse
import subprocess
import sys

from .docs_build import check


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config-file", default="mkdocs.yml", help="the site's mkdocs.yml (default ./mkdocs.yml)")
    p.add_argument("--addr", default="127.0.0.1:8000", help="address to serve on (default 127.0.0.1:8000)")


def run(config_file: str = "mkdocs.yml", addr: str = "127.0.0.1:8000") -> dict:
    cfg = check(config_file)
    rc = subprocess.call([sys.executable, "-m", "mkdocs", "serve", "-f", str(cfg), "-a", addr])
    return {"addr": addr, "exit": rc}


def render(r: dict) -> str:
    return f"normlab docs: the server on {r['addr']} stopped (exit {r['exit']})"
