"""The math of each normalization family, one module (room) per family.

- ``layer_norm``: LayerNorm and RMSNorm (and the fused residual adds)
- ``batch_norm``: BatchNorm and its running statistics
- ``group_norm``: GroupNorm and InstanceNorm

Inside each: ``reference.py`` (the formula in plain torch ops, the hand-derived
backward and forward-mode rule, the ``autograd.Function`` wiring: backend
``"ref"``), ``kernels.py`` (the Numba kernels: backend ``"cpu"``) and ``op.py``
(the kernels as ``torch.library`` custom ops, the eager and torch.func paths,
the entry points ``normlab.functional`` calls). Shared: ``_numba.py`` (compile
options, serial twins), ``_launch.py`` (handing tensors to kernels),
``_transforms.py`` (torch.func and forward-mode AD), ``_common.py`` (statistics
and forward-mode helpers). ``ops`` knows nothing of Modules, the CLI or
experiments.
"""
