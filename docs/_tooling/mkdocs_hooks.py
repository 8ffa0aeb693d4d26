"""MkDocs hooks of normlab's documentation site (``mkdocs.yml``: ``hooks:``).

- ``on_pre_build``: once per process, run the quick stability study into a fresh store in a
  temporary folder and keep its result as JSON (``NORMLAB_DOCS_STUDY``): the experiments page
  prints that result, so it shows the runs this build trained; then draw the figures
  (``normlab.figures.run``) there, the heat map read back from the same store.
- ``on_files``: add the figures to the site as ``figures/<name>.png``.
- ``on_page_content``: formulas (``$...$`` / ``$$...$$``, marked by pymdownx.arithmatex in
  its generic mode) become MathML at build time with latex2mathml: no script, no font and
  no network needed to read them.
- ``on_page_context`` / ``on_post_page``: an Indonesian page (``id/``) is rendered with the
  theme in Indonesian (``lang="id"``, "Cari", "Daftar isi", ...) and the navigation's titles
  from ``extra.nav_id`` in mkdocs.yml; both are put back for the next page. A title without a
  translation is a warning, so ``--strict`` fails on it.
- ``on_shutdown``: remove the temporary folder (after ``mkdocs build`` has copied the figures,
  or when ``mkdocs serve`` stops).
- ``on_post_build``: ``id/sitemap.xml``, the Indonesian pages, which the theme's language
  switch reads to stay on the same page (without it, every page logs a 404).
"""

from __future__ import annotations

import html
import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger("mkdocs.plugins.normlab")
_state: dict = {}

_INLINE = re.compile(r'<span class="arithmatex">\\\((.*?)\\\)</span>', re.S)
_BLOCK = re.compile(r'<div class="arithmatex">\\\[(.*?)\\\]</div>', re.S)
# latex2mathml (3.81) drops the last row of an array whose last cell is empty (a row written
# `y &= b &` just before \end{array}); an explicit empty group in that cell keeps the row.
_LAST_EMPTY_CELL = re.compile(r"&(\s*)\\end\{array\}")


def on_pre_build(config, **kwargs):
    if "figures" in _state:
        return
    from normlab import figures
    from normlab.experiments import stability

    tmp = _state["tmp"] = tempfile.mkdtemp(prefix="normlab-site-")
    store = os.path.join(tmp, "runs.sqlite")
    study = stability.run(quick=True, store=store, workers=1)
    study["store"] = "a temporary store of this build, removed when the build ends"
    os.environ["NORMLAB_DOCS_STUDY"] = os.path.join(tmp, "stability.json")
    Path(os.environ["NORMLAB_DOCS_STUDY"]).write_text(json.dumps(study))
    res = figures.run(out=os.path.join(tmp, "figures"), store=store)
    log.info("normlab: drew %d figures in %.1f s", len(res["figures"]), sum(f["seconds"] for f in res["figures"]))
    _state["figures"] = res["figures"]


def on_shutdown(**kwargs):
    tmp = _state.pop("tmp", None)
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
        _state.pop("figures", None)


def on_files(files, config, **kwargs):
    from mkdocs.structure.files import File

    for f in _state.get("figures", []):
        files.append(File.generated(config, f"figures/{Path(f['path']).name}", abs_src_path=f["path"]))
    return files


def to_mathml(latex: str, display: str = "inline") -> str:
    """MathML of a LaTeX formula, as the site shows it (``display``: "inline" or "block")."""
    from latex2mathml.converter import convert

    return convert(_LAST_EMPTY_CELL.sub(r"& {}\1\\end{array}", latex.strip()), display=display)


def _mathml(latex: str, display: str, page) -> str:
    try:
        return to_mathml(html.unescape(latex), display)
    except Exception as e:  # noqa: BLE001 - any parser failure is reported, and fails --strict
        log.warning("normlab: formula on %s not converted to MathML (%s): %s", page.file.src_uri, e, latex[:80])
        return html.escape(latex)


def on_page_content(html_text, page, config, files, **kwargs):
    html_text = _BLOCK.sub(lambda m: f'<div class="math-block">{_mathml(m.group(1), "block", page)}</div>', html_text)
    return _INLINE.sub(lambda m: _mathml(m.group(1), "inline", page), html_text)


def on_page_markdown(markdown, page, config, files, **kwargs):
    if page.file.src_uri.startswith("id/"):
        _state.setdefault("id_pages", set()).add(page.url)
    return markdown


def on_post_build(config, **kwargs):
    urls = sorted(_state.get("id_pages", ()))
    body = "".join(f"  <url><loc>{html.escape((config.site_url or '/') + u)}</loc></url>\n" for u in urls)
    path = Path(config.site_dir) / "id" / "sitemap.xml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('<?xml version="1.0" encoding="UTF-8"?>\n'
                    f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">\n{body}</urlset>\n')


def _nav_items(items):
    for item in items:
        yield item
        yield from _nav_items(getattr(item, "children", None) or [])


def on_page_context(context, page, config, nav, **kwargs):
    if not page.file.src_uri.startswith("id/"):
        return context
    names = config.extra.get("nav_id") or {}
    saved = [(config.theme, "language", config.theme["language"])]
    config.theme["language"] = "id"
    for item in _nav_items(nav.items):
        if item.title not in names:
            log.warning("normlab: mkdocs.yml extra.nav_id has no Indonesian title for %r", item.title)
            continue
        saved.append((item, "title", item.title))
        item.title = names[item.title]
    _state["restore"] = saved
    return context


def on_post_page(output, page, config, **kwargs):
    for obj, attr, value in reversed(_state.pop("restore", [])):
        if attr == "language":
            obj["language"] = value
        else:
            setattr(obj, attr, value)
    return output
