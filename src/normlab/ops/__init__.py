"""The math of each normalization family, one module (room) per family.

- ``layer_norm``: LayerNorm and RMSNorm (and the fused residual adds)
- ``batch_norm``: BatchNorm and its running statistics (``sync.py``: across ranks)
- ``group_norm``: GroupNorm and InstanceNorm

Inside each: ``reference.py`` (the formula in plain torch ops, the hand-derived
backward and forward-mode rule, the reference ``autograd.Function`` s, and the
entry points of backend ``"ref"``), ``kernels.py`` (the Numba kernels, no torch)
and ``op.py`` (what is the kernels' own: launchers, the custom ops' fakes,
backward, forward-mode and vmap rules, declared to ``_register``; the entry
points of backend ``"cpu"``). Importing a family enters its ops in the backend
table (``normlab._backend``), through which ``normlab.functional`` calls them.

Shared:

- ``_register.py``: builds each op's custom op, eager ``autograd.Function``
  and transform Function from the family's declaration, routes a call to one
  of them, and fills the backend table;
- ``_jit.py``: the kernels' side of the Numba boundary -- compile options, the
  ``@kernel`` and ``@helper`` decorators, the serial twins;
- ``_launch.py``: the op side -- numba present or not, which tensors the
  kernels serve, parallel or serial version, handing tensors to kernels;
- ``_bf16.py``, ``_ptr.py``, ``_rows.py``, ``_simd.py``: helpers of the kernels
  (half-precision bits, arrays over raw pointers, row reductions, SIMD hints);
- ``_transforms.py`` (torch.func and forward-mode AD) and ``_common.py``
  (statistics and forward-mode helpers in torch ops).

``ops`` knows nothing of Modules, the CLI or experiments.
"""
