"""Other libraries' norm classes that ``normlab.convert`` knows, registered as lazy finders.

Each finder is asked once per class, when convert or revert first meets a class
defined in that library; only then is the integration module (``hf.py``)
imported (``hf.py`` for transformers, ``timm.py`` for timm), and it never imports the
library itself beyond the modules the model already uses. ``import normlab`` imports
none of them.
"""

from __future__ import annotations

from .conversion import register_finder


def _transformers(cls: type):
    from . import hf

    return hf.conversion_for(cls)


register_finder("transformers.", _transformers)


def _timm(cls: type):
    from . import timm

    return timm.conversion_for(cls)


register_finder("timm.", _timm)
