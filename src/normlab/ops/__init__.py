"""The math of each normalization family, one room per family, and the Python side of its ops.

- ``layer_norm``: LayerNorm, RMSNorm, the fused residual adds, LayerNorm2d
- ``batch_norm``: BatchNorm and its running statistics (``sync.py``: across ranks)
- ``group_norm``: GroupNorm and InstanceNorm

Shared by the rooms: ``extension.py`` (loads ``normlab._C``; importing this package makes
backend ``"cpu"`` available when it is installed), ``_register.py`` (the Python autograd
Functions and custom ops), ``_transforms.py`` (torch.func rules), ``numerics.py``,
``layouts.py``, ``forward_mode.py``.

A room holds the family's math (``reference.py``) and what serves it below the public
functions; the entry that takes the path ``normlab._backend.route`` decided (``REF``, ``EAGER``,
``TRANSFORM``, ``COMPILE``) and runs it is the family's public function in
``normlab.functional``.
"""

from .. import _backend
from . import extension

if extension.available():
    _backend.install_cpu()
