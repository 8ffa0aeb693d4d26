"""The math of each normalization family, one module (room) per family.

- ``layer_norm``: LayerNorm and RMSNorm
- ``batch_norm``: BatchNorm and its running statistics
- ``group_norm``: GroupNorm and InstanceNorm

Inside each: the reference forward in plain torch ops, the hand-derived
backward, and the ``torch.autograd.Function`` wiring. ``ops`` knows nothing of
Modules, the CLI or experiments.
"""
