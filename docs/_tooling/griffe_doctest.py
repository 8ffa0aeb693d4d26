"""A griffe extension for the API reference: docstring examples (``>>>`` lines and their
output) become fenced ``pycon`` blocks, so that Markdown shows them as code rather than
as nested quotes. Nothing else in a docstring changes."""

from __future__ import annotations

import griffe


def fence_doctests(text: str) -> str:
    """Wrap each run of ``>>>``/``...`` lines and the output under them in a ```pycon fence."""
    out, block, indent = [], None, ""
    for line in text.splitlines():
        stripped = line.strip()
        if block is None:
            if stripped.startswith(">>>"):
                indent = line[: len(line) - len(line.lstrip())]
                block = [line[len(indent):]]
            else:
                out.append(line)
        elif stripped == "":
            out += [indent + "```pycon", *(indent + b for b in block), indent + "```", line]
            block = None
        else:
            block.append(line[len(indent):] if line.startswith(indent) else stripped)
    if block is not None:
        out += [indent + "```pycon", *(indent + b for b in block), indent + "```"]
    return "\n".join(out)


class FenceDoctests(griffe.Extension):
    """Applied to every object's docstring as griffe loads it."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)
