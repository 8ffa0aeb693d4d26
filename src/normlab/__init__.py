"""normlab: normalization layers for PyTorch.

Exact drop-ins for torch.nn's normalization layers, with the math written
plainly and the gradients derived by hand.

>>> import torch, normlab
>>> ln = normlab.nn.LayerNorm(6)              # torch.nn.LayerNorm's arguments and state_dict
>>> ln(torch.randn(4, 6)).shape
torch.Size([4, 6])
>>> model = normlab.convert(torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3)))
>>> type(model[1]) is normlab.nn.BatchNorm1d
True
"""

from . import functional, nn
from ._version import __version__
from ._backend import available_backends, backend_for, get_backend, set_backend, use_backend
from .tools.conversion import convert, register_conversion, revert
from .tools import fold, freeze_batch_norm, inspect, recalibrate_batch_norm, unfreeze_batch_norm

__all__ = [
    "functional",
    "nn",
    "convert",
    "revert",
    "register_conversion",
    "freeze_batch_norm",
    "unfreeze_batch_norm",
    "recalibrate_batch_norm",
    "fold",
    "inspect",
    "set_backend",
    "use_backend",
    "get_backend",
    "available_backends",
    "backend_for",
    "__version__",
]
