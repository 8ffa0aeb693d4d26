"""The built documentation site, shared by tests/docs: one ``mkdocs build --strict`` per session
(``NORMLAB_SITE_DIR`` reuses a site already built there), a local web server over it, and
headless Chromium (Debian's package, driven by playwright).

Skips, saying why, where mkdocs (the docs extra) or Chromium is absent."""

from __future__ import annotations

import functools
import http.server
import importlib.util
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("NORMLAB_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
MISSING = [m for m in ("mkdocs", "material", "mkdocstrings", "markdown_exec", "latex2mathml")
           if importlib.util.find_spec(m) is None]
NEEDS_DOCS = pytest.mark.skipif(bool(MISSING), reason=f"the docs extra is not installed (missing {', '.join(MISSING)}):"
                                                      " pip install '.[docs]'")


class Built:
    """A built site: its folder, and the build's temporary folder (None when reused)."""

    def __init__(self, path: Path, tmpdir: Path | None):
        self.path, self.tmpdir = path, tmpdir


def build(dest: Path, tmpdir: Path) -> Path:
    """``mkdocs build --strict`` into ``dest``, with ``tmpdir`` as the build's TMPDIR."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", TMPDIR=str(tmpdir))
    p = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                        "-d", str(dest)], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, f"mkdocs build --strict failed:\n{p.stderr[-4000:]}"
    return dest


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> Built:
    if MISSING:
        pytest.skip(f"the docs extra is not installed (missing {', '.join(MISSING)}): pip install '.[docs]'")
    reuse = os.environ.get("NORMLAB_SITE_DIR")
    if reuse and (Path(reuse) / "index.html").exists():
        return Built(Path(reuse).resolve(), None)  # absolute: pages are opened as file:// URIs
    root = tmp_path_factory.mktemp("docs")
    (root / "tmp").mkdir()
    return Built(build(root / "site", root / "tmp"), root / "tmp")


@pytest.fixture(scope="session")
def site(built) -> Path:
    return built.path


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep the test output clean
        pass


@pytest.fixture(scope="session")
def server(site):
    handler = functools.partial(_QuietHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


@pytest.fixture(scope="session")
def browser():
    if importlib.util.find_spec("playwright") is None:
        pytest.skip("playwright (the docs extra) is not installed: pip install '.[docs]'")
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        pytest.skip(f"Chromium is absent ({CHROMIUM}); install Debian's: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium"),
                               args=ARGS, headless=True)
        yield b
        b.close()


def pages(site: Path) -> list[str]:
    """Every page of the site, as its path from the site's root (``chapters/layernorm.html``)."""
    return sorted(str(p.relative_to(site)) for p in site.rglob("*.html")
                  if p.name != "404.html" and "assets" not in p.relative_to(site).parts)
