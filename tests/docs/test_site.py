"""The documentation site, built with ``mkdocs build --strict`` and opened page by page in
headless Chromium (Debian's package, driven by playwright): no console errors, no request
leaving the site, every image loaded with a size, no broken internal link, formulas rendered
as MathML elements, the search index present, the Indonesian pages reachable from the switch.

Skips, saying why, where mkdocs (the docs extra) or Chromium is absent. Run alone with
``pytest tests/docs -p no:xdist``; ``NORMLAB_SITE_DIR`` reuses a site already built there.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urljoin, urlparse, unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("NORMLAB_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
MISSING = [m for m in ("mkdocs", "material", "mkdocstrings", "markdown_exec", "latex2mathml")
           if importlib.util.find_spec(m) is None]

pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"the docs extra is not installed (missing {', '.join(MISSING)}):"
                                                     " pip install '.[docs]'")


def build(dest: Path) -> Path:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    p = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                        "-d", str(dest)], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, f"mkdocs build --strict failed:\n{p.stderr[-4000:]}"
    return dest


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    reuse = os.environ.get("NORMLAB_SITE_DIR")
    if reuse and (Path(reuse) / "index.html").exists():
        return Path(reuse)
    return build(tmp_path_factory.mktemp("docs") / "site")


@pytest.fixture(scope="module")
def server(site):
    handler = functools.partial(_QuietHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep the test output clean
        pass


def pages(site: Path) -> list[str]:
    return sorted(str(p.relative_to(site).parent).replace(".", "") + "/" if p.parent != site else ""
                  for p in site.rglob("index.html"))


# --- without a browser -------------------------------------------------------------------------

def test_every_section_is_built(site):
    built = {p.strip("/") for p in pages(site)}
    for page in ("", "getting-started", "layers", "chapters/layernorm", "chapters/batchnorm", "chapters/shapes",
                 "pictures", "experiments", "lifecycle", "distributed", "performance", "derivations/layer_norm",
                 "derivations/batch_norm", "derivations/group_norm", "derivations/batch_norm_variants",
                 "derivations/forward_mode", "api/normlab", "api/nn", "api/functional", "api/tools", "id",
                 "id/chapters/layernorm", "id/chapters/batchnorm", "id/chapters/shapes"):
        assert page in built, page
    for name in ("norm_axes", "saturation", "batch_dependence", "running_stats", "stability_map"):
        assert (site / "figures" / f"{name}.png").stat().st_size > 10_000


def test_search_index_covers_the_pages(site):
    index = json.loads((site / "search" / "search_index.json").read_text())
    locations = {d["location"].split("#")[0] for d in index["docs"]}
    for page in ("chapters/layernorm/", "api/nn/", "id/chapters/batchnorm/", "derivations/batch_norm/"):
        assert page in locations, page
    text = " ".join(d["text"] for d in index["docs"])
    assert "normlab.nn.LayerNorm" in text or "LayerNorm" in text


def test_chapter_outputs_are_real(site):
    # numbers the source chapters print (seeds/000 layernorm_manual.py, seeds/001
    # batchnorm_train_eval.py), found in the pages' executed output
    ln = (site / "chapters/layernorm/index.html").read_text()
    assert "[1.135, 1.666, 0.215, -3.637, 0.277, -1.038]" in ln
    bn = (site / "id/chapters/batchnorm/index.html").read_text()
    assert "[-1.3416, -1.3416, -1.3416]" in bn and "[0.4, 0.5, 0.6]" in bn and "mode train pada" in bn
    api = (site / "api/nn/index.html").read_text()
    for name in ("LayerNorm", "RMSNorm", "BatchNorm1d", "GroupNorm", "SyncBatchNorm", "LayerNorm2d"):
        assert f'id="normlab.nn.{name}"' in api, name


def test_no_reference_leaves_the_site(site):
    """No page or stylesheet loads a script, stylesheet, font or image from elsewhere (the theme's
    script names a polyfill and a diagram library it would fetch only when needed: the browser
    test below catches any request that really leaves the site)."""
    tag = re.compile(r"<(?:script|link|img|iframe|source)\b[^>]*?(?:src|href)=[\"']((?:https?:)?//[^\"']+)", re.I)
    css = re.compile(r"(?:@import\s+(?:url\()?|url\()[\"']?((?:https?:)?//[^\"')]+)", re.I)
    offenders = []
    for f in site.rglob("*.html"):
        offenders += [f"{f.relative_to(site)}: {u}" for u in tag.findall(f.read_text(errors="replace"))]
    for f in site.rglob("*.css"):
        offenders += [f"{f.relative_to(site)}: {u}" for u in css.findall(f.read_text(errors="replace"))]
    assert not offenders, offenders


# --- in Chromium ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
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


def _exists(site: Path, url: str, base: str) -> bool:
    path = unquote(urlparse(url).path)[len(urlparse(base).path):]
    target = site / path
    return target.is_file() or (target / "index.html").is_file()


def test_every_page_in_chromium(site, server, browser):
    problems = []
    ctx = browser.new_context()
    outside: list[str] = []
    ctx.route("**/*", lambda route: (outside.append(route.request.url), route.abort())
              if not route.request.url.startswith(server) and not route.request.url.startswith("data:")
              else route.continue_())
    page = ctx.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    all_pages = pages(site)
    assert len(all_pages) >= 24
    math_pages = 0
    for rel in all_pages:
        errors.clear()
        url = urljoin(server, rel)
        resp = page.goto(url, wait_until="load")
        if resp is None or resp.status != 200:
            problems.append(f"{rel}: HTTP {resp and resp.status}")
            continue
        page.wait_for_timeout(50)
        for src, ok, w, h in page.eval_on_selector_all(
                "img", "els => els.map(i => [i.currentSrc || i.src, i.complete, i.naturalWidth, i.naturalHeight])"):
            if not (ok and w > 0 and h > 0):
                problems.append(f"{rel}: image {src} did not load ({w}x{h})")
        for href in page.eval_on_selector_all("a[href]", "els => els.map(a => a.href)"):
            if href.startswith(server) and not _exists(site, href.split("#")[0], server):
                problems.append(f"{rel}: broken link {href}")
        n_math = page.eval_on_selector_all("math", "els => els.length")
        math_pages += n_math > 0
        text = page.inner_text("article")
        for raw in ("\\frac", "\\(", "\\[", "$$", "\\sqrt", "\\mathbb"):
            if raw in text:
                problems.append(f"{rel}: raw LaTeX {raw!r} shown as text")
        if (rel.startswith("derivations/") or rel.startswith("chapters/") or rel.startswith("id/chapters")) \
                and rel != "chapters/shapes/" and not n_math:
            problems.append(f"{rel}: no <math> element")
        problems += [f"{rel}: console error: {e}" for e in errors]
    problems += [f"request leaving the site: {u}" for u in outside]
    assert math_pages >= 10
    # the search index, as the page's search loads it
    assert page.request.get(urljoin(server, "search/search_index.json")).status == 200
    ctx.close()
    assert not problems, "\n".join(problems[:40])


def test_indonesian_pages_reachable_from_the_switch(site, server, browser):
    page = browser.new_page()
    page.goto(urljoin(server, "chapters/layernorm/"))
    switch = page.locator("a.md-select__link[hreflang=id]")
    assert switch.count() == 1
    page.goto(switch.get_attribute("href") and urljoin(page.url, switch.get_attribute("href")))
    assert page.url == urljoin(server, "id/")
    assert page.get_attribute("html", "lang") == "id"
    for chapter in ("layernorm", "batchnorm", "shapes"):
        link = page.locator(f"article a[href$='chapters/{chapter}/']")
        assert link.count() >= 1, chapter
        twin = urljoin(page.url, link.first.get_attribute("href"))
        page.goto(twin)
        assert page.get_attribute("html", "lang") == "id" and "/id/chapters/" in page.url
        # each English chapter page links to its Indonesian twin and back
        page.goto(urljoin(server, f"chapters/{chapter}/"))
        assert page.locator(f"article a[href$='id/chapters/{chapter}/']").count() == 1
        page.goto(urljoin(server, "id/"))
    page.close()
