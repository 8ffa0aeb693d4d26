"""DyT: the family's entry, running the path ``normlab._backend.route`` decided.

Every path runs the reference math for now (``reference.ref_dyt``): torch ops, which eager
autograd, torch.func transforms, torch.compile and export all take as they are.
"""

from __future__ import annotations

from .reference import ref_dyt


def dyt(path, x, normalized_shape, alpha, w, b):
    """DyT over the trailing ``normalized_shape`` dims of ``x`` on ``path`` (arguments judged by
    ``normlab.functional.dyt``)."""
    return ref_dyt(x, normalized_shape, alpha, w, b)
