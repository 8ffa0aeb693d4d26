"""normlab.functional: the normalizations as functions, with torch.nn.functional's signatures.

Each function asks the gate (``normlab._backend.route``) which path the call
takes, judges its arguments (raising the exception class torch raises for the
same mistake, with what was expected and what was given; on the eager ``"cpu"``
path the C++ entry judges them first, by the same rules, and hands anything it
does not take to these checks), then runs the family's op in ``normlab.ops`` on
that path. Nothing is broadcast silently: a weight must have exactly the
shape the op expects.

>>> import torch, normlab.functional as NF
>>> x = torch.randn(4, 6)
>>> y = NF.layer_norm(x, (6,))
>>> torch.allclose(y, torch.nn.functional.layer_norm(x, (6,)), atol=1e-6)
True
"""

from .batch_norms import batch_norm, batch_renorm, ghost_batch_norm
from .norm_free import dyt
from .evo_norms import evo_norm2d_b0, evo_norm2d_s0
from .frn import filter_response_norm
from .group_norms import group_norm, instance_norm
from .local_response_norms import local_response_norm
from .norm_act import batch_norm_act, group_norm_act, layer_norm_act, layer_norm_act2d
from .row_norms import add_layer_norm, add_rms_norm, layer_norm, layer_norm2d, rms_norm
from .scale_norms import rms_norm2d, simple_norm, simple_norm2d

__all__ = [
    "layer_norm",
    "rms_norm",
    "add_layer_norm",
    "add_rms_norm",
    "batch_norm",
    "group_norm",
    "instance_norm",
    "layer_norm2d",
    "batch_renorm",
    "ghost_batch_norm",
    "dyt",
    "local_response_norm",
    "rms_norm2d",
    "simple_norm",
    "simple_norm2d",
    "filter_response_norm",
    "evo_norm2d_b0",
    "evo_norm2d_s0",
    "batch_norm_act",
    "group_norm_act",
    "layer_norm_act",
    "layer_norm_act2d",
]
