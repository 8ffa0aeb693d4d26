"""EvoNorm (Liu, Brock, Simonyan and Le, "Evolving Normalization-Activation Layers", NeurIPS 2020;
timm's EvoNorm2dB0 and EvoNorm2dS0): normalization and activation in one expression.

- ``reference.py``: the math in torch ops, the hand-derived backward, the autograd Functions and
  the ``REF`` paths (``ref_evo_b0``, ``ref_evo_s0``).

The entries that run each path of the gate are the public functions,
``normlab.functional.evo_norm2d_b0`` and ``evo_norm2d_s0``.
"""

from .reference import (EvoB0Function, EvoS0Function, evo_b0_backward_ref, evo_b0_ref, evo_s0_backward_ref,
                        evo_s0_ref, ref_evo_b0, ref_evo_s0)

__all__ = ["evo_b0_ref", "evo_b0_backward_ref", "EvoB0Function", "ref_evo_b0",
           "evo_s0_ref", "evo_s0_backward_ref", "EvoS0Function", "ref_evo_s0"]
