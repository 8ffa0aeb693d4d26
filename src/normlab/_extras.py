"""The optional packages: what each is for, which extra brings it, and the one line a user
reads when one is missing.

``import normlab`` and the layers need torch and numpy only. The experiments, their plots
and reports, and the terminal tables come with the ``experiments`` extra
(``pip install 'normlab[experiments]'``), imported where they are used.
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: top-level module -> (its name on PyPI, the extra that brings it)
OPTIONAL = {
    "matplotlib": ("matplotlib", "experiments"),
    "sklearn": ("scikit-learn", "experiments"),
    "rich": ("rich", "experiments"),
    "markdown": ("markdown", "experiments"),
}


def missing(error: ImportError, what: str) -> str | None:
    """One line saying that ``what`` (``"normlab report"``) needs the package ``error`` could not
    import, and which extra to install; None when ``error`` is not about an optional package."""
    name = (getattr(error, "name", None) or "").split(".")[0]
    if name not in OPTIONAL:
        return None
    pip_name, extra = OPTIONAL[name]
    return (f"{what}: needs {pip_name}, which comes with normlab's {extra} extra: "
            f"pip install 'normlab[{extra}]' (from a checkout: pip install --no-build-isolation '.[{extra}]')")


def require(module: str, what: str) -> ModuleType:
    """``import module``, or a ``ModuleNotFoundError`` whose message is :func:`missing`'s line."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        message = missing(e, what)
        if message is None:
            raise
        raise ModuleNotFoundError(message, name=e.name) from None
