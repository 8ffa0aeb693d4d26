"""Local response normalization: the family's entry, running the path ``normlab._backend.route``
decided.

The family has no C++ kernel (a rare layer; torch's own is composed of pooling ops), so every
path -- ``REF``, ``EAGER``, ``TRANSFORM``, ``COMPILE`` -- runs the reference Function
(``reference.LocalResponseNormFunction``): torch ops throughout, which torch.func batches
(its vmap rule is generated), forward-mode AD differentiates by its hand-derived jvp, and
torch.compile traces as they are.
"""

from __future__ import annotations

from .reference import ref_local_response_norm


def local_response_norm(path, x, size, alpha, beta, k, kind="lrn"):
    """LRN of ``x`` (N, C, *) across channels on ``path`` (arguments judged by
    ``normlab.functional.local_response_norm``); ``kind``: ``"lrn"`` (torch.nn.LocalResponseNorm's
    window) or ``"cross_map"`` (torch.nn.CrossMapLRN2d's)."""
    del path  # every path runs the reference (no kernel: see the module docstring)
    return ref_local_response_norm(x, size, alpha, beta, k, kind)
