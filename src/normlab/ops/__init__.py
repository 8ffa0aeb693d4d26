"""The math of each normalization family, one room per family, and the Python side of its ops.

- ``layer_norm``: LayerNorm, RMSNorm, the fused residual adds, LayerNorm2d
- ``batch_norm``: BatchNorm and its running statistics (``sync.py``: across ranks)
- ``group_norm``: GroupNorm and InstanceNorm

Shared by the rooms: ``extension.py`` (loads ``normlab._C``), ``_register.py`` (the backend
table entries and the Python autograd Functions), ``_transforms.py`` (torch.func rules),
``numerics.py``, ``layouts.py``, ``forward_mode.py``.
"""
