"""``normlab warmup``: kept for old scripts; there is nothing to compile any more.

The "cpu" kernels are C++, compiled once when normlab is installed (``normlab._C``), so no
kernel is compiled at import or first use. The command prints that and exits 0.
"""

from __future__ import annotations

from .ops import extension

__all__ = ["run", "render"]


def run() -> dict:
    """What the installed backend is: ``{"compiled_at_install": bool, "build": build_info}``."""
    return {"compiled_at_install": extension.available(), "build": extension.build_info()}


def render(result: dict) -> str:
    if result["compiled_at_install"]:
        level = result["build"].get("level") or "the compiler's default target"
        return (f"normlab warmup: nothing to compile: the cpu kernels were compiled when normlab was "
                f"installed (normlab._C, x86-64-{level}, torch {result['build'].get('torch')})")
    return ("normlab warmup: nothing to compile: this install has no C++ extension (backend 'ref' only); "
            "reinstall from source with a C++ compiler to get the 'cpu' backend")
