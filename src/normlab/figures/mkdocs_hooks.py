"""MkDocs hooks of normlab's documentation site (``mkdocs.yml``: ``hooks:``).

- ``on_pre_build``: draw the figures (``normlab.figures.run``) into a temporary folder, once
  per process, with the quick stability study in a store that the experiments page reads
  back (``NORMLAB_DOCS_STORE``), so that the page's table and the heat map are the same runs.
- ``on_files``: add the figures to the site as ``figures/<name>.png``.
- ``on_page_content``: formulas (``$...$`` / ``$$...$$``, marked by pymdownx.arithmatex in
  its generic mode) become MathML at build time with latex2mathml: no script, no font and
  no network needed to read them.
- ``on_post_page``: the Indonesian pages (``id/``) say ``lang="id"``.
- ``on_post_build``: ``id/sitemap.xml``, the Indonesian pages, which the theme's language
  switch reads to stay on the same page (without it, every page logs a 404).
"""

from __future__ import annotations

import html
import logging
import os
import re
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

    tmp = tempfile.mkdtemp(prefix="normlab-site-")
    store = os.environ.setdefault("NORMLAB_DOCS_STORE", os.path.join(tmp, "runs.sqlite"))
    res = figures.run(out=os.path.join(tmp, "figures"), store=store)
    log.info("normlab: drew %d figures in %.1f s", len(res["figures"]), sum(f["seconds"] for f in res["figures"]))
    _state["figures"] = res["figures"]


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


def on_post_page(output, page, config, **kwargs):
    if page.file.src_uri.startswith("id/"):
        output = output.replace('<html lang="en"', '<html lang="id"', 1)
    return output
