"""What every family's ``op.py`` needs to hand tensors to its Numba kernels.

- :func:`kernels_loader`: the family's ``kernels.py`` (numba and all), imported
  on the first kernel call, so ``import normlab`` never imports numba.
- :func:`bits`: a numpy view of a tensor's storage, no copy. Numba has no
  bfloat16, so half tensors travel as their bits: bfloat16 as int16, float16 as
  uint16; the kernels convert them (``ops/_bf16.py``).
- :func:`param`: a weight or bias as a contiguous 1-D array in the
  accumulation dtype, or a cached array of ones/zeros when it is None.
"""

from __future__ import annotations

import importlib
from typing import Callable, Optional

import torch

_BITS = {torch.bfloat16: torch.int16, torch.float16: torch.uint16}
_FILL: dict = {}  # (n, dtype, value) -> read-only array of ones / zeros


def kernels_loader(package: str) -> Callable:
    """A function returning ``<package>.kernels``, imported on its first call."""
    module = None

    def load():
        nonlocal module
        if module is None:
            module = importlib.import_module(package + ".kernels")
        return module

    return load


def bits(t: torch.Tensor):
    """A numpy view of ``t``'s storage: bfloat16 as int16 bits, float16 as uint16 bits."""
    if t.requires_grad:
        t = t.detach()
    as_bits = _BITS.get(t.dtype)
    return (t if as_bits is None else t.view(as_bits)).numpy()


def param(p: Optional[torch.Tensor], n: int, acc: torch.dtype, fill: float):
    """Weight or bias as a contiguous (n,) array in dtype ``acc`` (``fill`` everywhere if None)."""
    if p is None:
        key = (n, acc, fill)
        arr = _FILL.get(key)
        if arr is None:
            if len(_FILL) > 64:
                _FILL.clear()
            arr = _FILL[key] = torch.full((n,), fill, dtype=acc).numpy()
        return arr
    p = p.detach()
    if p.dtype != acc or not p.is_contiguous():
        p = p.to(acc).contiguous()
    return (p if p.dim() == 1 else p.reshape(-1)).numpy()
