"""Norm + activation: the fused eager entries (``op.py``); the activations' math is
``normlab.ops.activation`` and the unfused composition (the ``"ref"`` path) is
``normlab.functional.norm_act``'s."""

from . import op

__all__ = ["op"]
