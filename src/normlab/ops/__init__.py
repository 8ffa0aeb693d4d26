"""The math of each normalization family, one room per family, and the Python side of its ops.

- ``layer_norm``: LayerNorm, RMSNorm, the fused residual adds, LayerNorm2d
- ``batch_norm``: BatchNorm and its running statistics (``sync.py``: across ranks)
- ``group_norm``: GroupNorm and InstanceNorm

Each room: ``reference.py`` (the formula in torch ops, the hand-derived backward and
forward-mode rule: the ``"ref"`` backend and the oracle) and ``op.py`` (the ``"cpu"`` backend:
calls into the C++ ops of ``csrc/``, the torch.func rules). Shared: ``extension.py`` (loads
``normlab._C``), ``_register.py``, ``_transforms.py``, ``_common.py``. The architecture, once:
``docs/architecture.md``.
"""
