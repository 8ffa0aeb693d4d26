"""The documentation site as built (``mkdocs build --strict``), read as files: every section
there, the search index (also inlined for pages opened from disk), the chapters' real outputs
printed as the chapters print them, no reference leaving the site, the experiments page showing
the run this build made, the build's temporary folder cleaned up, the API pages as torch's read.

The pages in Chromium: test_site_browser.py. Run alone with ``pytest tests/docs -n 1``;
``NORMLAB_SITE_DIR`` reuses a site already built there."""

from __future__ import annotations

import json
import re

import pytest

import normlab.nn
from .conftest import NEEDS_DOCS, pages

pytestmark = NEEDS_DOCS

CHAPTER_PAGES = ("chapters/layernorm.html", "chapters/batchnorm.html", "chapters/shapes.html",
                 "id/chapters/layernorm.html", "id/chapters/batchnorm.html", "id/chapters/shapes.html")


def _outputs(html: str) -> str:
    """The text of the page's code blocks (sources and live outputs), tags removed."""
    return "\n".join(re.sub(r"<[^>]+>", "", b) for b in re.findall(r"<pre[^>]*>(.*?)</pre>", html, re.S))


def test_every_section_is_built(site):
    built = set(pages(site))
    for page in ("index", "getting-started", "layers", "chapters/layernorm", "chapters/batchnorm", "chapters/shapes",
                 "pictures", "experiments", "lifecycle", "distributed", "performance", "derivations/layer_norm",
                 "derivations/batch_norm", "derivations/group_norm", "derivations/batch_norm_variants",
                 "derivations/forward_mode", "api/normlab", "api/nn", "api/functional", "api/tools", "id/index",
                 "id/chapters/layernorm", "id/chapters/batchnorm", "id/chapters/shapes"):
        assert f"{page}.html" in built, page
    for name in ("norm_axes", "saturation", "batch_dependence", "running_stats", "stability_map"):
        assert (site / "figures" / f"{name}.png").stat().st_size > 10_000


def test_search_index_covers_the_pages(site):
    index = json.loads((site / "search" / "search_index.json").read_text())
    locations = {d["location"].split("#")[0] for d in index["docs"]}
    for page in ("chapters/layernorm.html", "api/nn.html", "id/chapters/batchnorm.html", "derivations/batch_norm.html"):
        assert page in locations, page
    assert any(d["location"] == "api/nn.html#normlab.nn.GroupNorm" for d in index["docs"])
    # the same index as a script, for pages opened from disk (file:// may not fetch JSON)
    assert (site / "search" / "search_index.js").read_text().startswith("var __index = {")


def test_chapter_outputs_are_real(site):
    # numbers the source chapters print (seeds/000 layernorm_manual.py, seeds/001
    # batchnorm_train_eval.py), found in the pages' executed output
    ln = (site / "chapters/layernorm.html").read_text()
    assert "[1.135, 1.666, 0.215, -3.637, 0.277, -1.038]" in ln
    assert "[0.698, -0.205, -0.303, -0.332, -0.139, 0.281]" in ln
    bn = (site / "id/chapters/batchnorm.html").read_text()
    assert "[-1.3416, -1.3416, -1.3416]" in bn and "[0.4, 0.5, 0.6]" in bn and "mode train pada" in bn


@pytest.mark.parametrize("page", CHAPTER_PAGES)
def test_chapter_pages_print_rounded_values(site, page):
    """What the chapters print: rounded values, never float32's tail (0.6980000138282776) or a
    -0.0 in a list. A difference such as 2.384185791015625e-07 is printed whole, as the chapter
    prints it."""
    text = _outputs((site / page).read_text())
    noise = re.findall(r"-?\d+\.\d{7,}(?![\de])", text)
    assert not noise, noise[:5]
    assert not re.search(r"[\[(, ]-0\.0[,\])]", text), re.findall(r".{40}[\[(, ]-0\.0[,\])]", text)[:3]


def test_no_reference_leaves_the_site(site):
    """No page or stylesheet loads a script, stylesheet, font or image from elsewhere (the theme's
    script names a polyfill and a diagram library it would fetch only when needed: the browser
    test catches any request that really leaves the site)."""
    tag = re.compile(r"<(?:script|link|img|iframe|source)\b[^>]*?(?:src|href)=[\"']((?:https?:)?//[^\"']+)", re.I)
    css = re.compile(r"(?:@import\s+(?:url\()?|url\()[\"']?((?:https?:)?//[^\"')]+)", re.I)
    offenders = []
    for f in site.rglob("*.html"):
        offenders += [f"{f.relative_to(site)}: {u}" for u in tag.findall(f.read_text(errors="replace"))]
    for f in site.rglob("*.css"):
        offenders += [f"{f.relative_to(site)}: {u}" for u in css.findall(f.read_text(errors="replace"))]
    assert not offenders, offenders


def test_experiments_page_shows_the_run_this_build_made(site):
    """The page says the build runs the quick study; its output says it trained the runs (not
    "already in the store"), and names no temporary folder."""
    text = re.sub(r"<[^>]+>", "", (site / "experiments.html").read_text())
    assert re.search(r"trained 80 runs in [\d.]+ s", text)
    assert "already in the store" not in text and "nothing trained" not in text
    assert "normlab-site-" not in text and "/tmp/" not in text


def test_the_build_leaves_no_temporary_folder(built):
    """``normlab docs build`` (mkdocs build) removes the folder its figures and study used."""
    if built.tmpdir is None:
        pytest.skip("NORMLAB_SITE_DIR: a site built elsewhere, its temporary folder not known here")
    # (torch's own compile cache, torchinductor_<user>, is meant to stay)
    assert [p.name for p in built.tmpdir.iterdir() if p.name.startswith("normlab")] == []


def test_api_pages_read_like_torchs(site):
    html = (site / "api/nn.html").read_text()
    for name in normlab.nn.__all__:
        assert f'id="normlab.nn.{name}"' in html, name
    text = re.sub(r"<[^>]+>", "", html)
    assert "__all__" not in text and "module-attribute" not in text
    for page in ("nn", "normlab", "functional", "tools"):
        body = re.sub(r"<[^>]+>", "", (site / f"api/{page}.html").read_text())
        assert not re.search(r"Bases:\s*_", body), page             # no private base class named
    # the module's description once, not repeated by the page around it
    assert text.count("Same constructor arguments and defaults") == 1
    assert text.count("torch.nn twins") == 1
    # signatures are formatted: one argument a line once they are long
    sig = re.sub(r"<[^>]+>", "", re.search(r'id="normlab.nn.BatchNorm1d".*?<pre[^>]*>(.*?)</pre>', html, re.S)[1])
    assert max(len(line) for line in sig.splitlines()) <= 72, sig


def test_performance_page_compares_with_what_a_user_would_pick_instead(site):
    """The large-tensor table is normlab against torch eager and torch.compile (the history
    against the former kernels is in docs/notes), with normlab bench's plots and the slower rows."""
    html = (site / "performance.html").read_text()
    headers = [re.sub(r"<[^>]+>", "", h) for h in re.findall(r"<th[^>]*>(.*?)</th>", html, re.S)]
    assert {"torch", "compile", "normlab"} <= set(headers) and not any("Numba" in h for h in headers)
    for name in ("large-float32-t1.png", "large-bfloat16-t1.png"):
        assert f'src="bench/{name}"' in html and (site / "bench" / name).stat().st_size > 10_000
    assert re.search(r"<td[^>]*>[^<]*<strong>0\.\d\d</strong>", html)          # a row where normlab is slower
    assert re.findall(r'<h2 id="[^"]*">([^<]*)', html)[-1] == "Shape sweep and memory"
