"""timm's Filter Response Normalization layers: FilterResponseNormTlu2d, FilterResponseNormAct2d."""

from __future__ import annotations

import inspect

import torch
from torch import nn

from .. import functional as F
from ._base import _NotScriptable, check_dtype, check_eps, check_size

__all__ = ["FilterResponseNormTlu2d", "FilterResponseNormAct2d"]

# act_layer names -> torch.nn classes (timm's create_act_layer names; kwargs they are built with).
# A private table until the shared one (nn/_activations.py) takes these over.
_ACTS: dict[str, tuple[type, dict]] = {
    "relu": (nn.ReLU, {}), "relu6": (nn.ReLU6, {}), "leaky_relu": (nn.LeakyReLU, {}), "elu": (nn.ELU, {}),
    "celu": (nn.CELU, {}), "selu": (nn.SELU, {}), "silu": (nn.SiLU, {}), "swish": (nn.SiLU, {}),
    "mish": (nn.Mish, {}), "gelu": (nn.GELU, {}), "gelu_tanh": (nn.GELU, {"approximate": "tanh"}),
    "sigmoid": (nn.Sigmoid, {}), "tanh": (nn.Tanh, {}), "hard_sigmoid": (nn.Hardsigmoid, {}),
    "hardsigmoid": (nn.Hardsigmoid, {}), "hard_swish": (nn.Hardswish, {}), "hardswish": (nn.Hardswish, {}),
    "prelu": (nn.PReLU, {}), "identity": (nn.Identity, {}),
}


def _parameters(cls: type):
    try:
        return inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return {}


def make_act(cls_name: str, act_layer, inplace, **factory) -> nn.Module:
    """timm's ``create_act_layer(act_layer, inplace=inplace)``: a name from ``_ACTS`` or an
    ``nn.Module`` subclass, instantiated (with ``inplace`` where the class takes it)."""
    if isinstance(act_layer, str):
        entry = _ACTS.get(act_layer.lower())
        if entry is None:
            raise ValueError(f"{cls_name}: unknown activation {act_layer!r}; expected one of "
                             f"{', '.join(sorted(_ACTS))}, or an nn.Module class")
        cls, kwargs = entry
    elif isinstance(act_layer, type) and issubclass(act_layer, nn.Module):
        cls, kwargs = act_layer, {}
    else:
        raise TypeError(f"{cls_name}: expected act_layer to be an activation name (e.g. 'relu'), an nn.Module "
                        f"class (e.g. nn.ReLU) or None, got {act_layer!r}")
    if inplace is not None and not isinstance(inplace, bool):
        raise TypeError(f"{cls_name}: expected inplace to be a bool or None, got {inplace!r}")
    if inplace is not None and "inplace" in _parameters(cls):  # timm: inplace where the class takes it
        kwargs = {**kwargs, "inplace": inplace}
    if cls is nn.PReLU:
        kwargs = {**kwargs, **factory}
    return cls(**kwargs)


class _FRN(_NotScriptable, nn.Module):
    def _init(self, num_features, eps, rms, device, dtype, tau: bool) -> None:
        cls = type(self).__name__
        check_size(cls, "num_features", num_features, "the input's dim 1")
        check_eps(cls, eps)
        check_dtype(cls, dtype)
        if not isinstance(rms, bool):
            raise TypeError(f"{cls}: expected rms to be a bool, got {rms!r}")
        dd = {"device": device, "dtype": dtype}
        self.rms = rms  # timm's flag: stored, never read (the layer always divides by the RMS)
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(num_features, **dd))
        self.bias = nn.Parameter(torch.empty(num_features, **dd))
        self.tau = nn.Parameter(torch.empty(num_features, **dd)) if tau else None

    def reset_parameters(self) -> None:
        """``weight`` to ones, ``bias`` (and ``tau``) to zeros."""
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)
        if getattr(self, "tau", None) is not None:
            nn.init.zeros_(self.tau)


class FilterResponseNormTlu2d(_FRN):
    """Filter Response Normalization with its thresholded linear unit (Singh and Krishnan, CVPR 2020;
    timm's ``FilterResponseNormTlu2d``): ``y = max(x / sqrt(mean_HW(x^2) + eps) * weight + bias, tau)``
    per (sample, channel); ``apply_act=False``: no ``tau``, no max.

    timm's constructor, defaults (``eps=1e-5``) and ``state_dict`` keys (``weight``, ``bias``,
    ``tau``); the output in the input's memory format. Numerics: the mean square in float32 for
    half-precision and float32 input and float64 for float64; the output is rounded once.

    >>> import torch, normlab
    >>> normlab.nn.FilterResponseNormTlu2d(1)(torch.tensor([[[[3.0, -4.0]]]]))
    tensor([[[[0.8485, 0.0000]]]], grad_fn=<...>)
    """

    def __init__(self, num_features: int, apply_act: bool = True, eps: float = 1e-5, rms: bool = True,
                 device=None, dtype=None) -> None:
        if not isinstance(apply_act, bool):
            raise TypeError(f"FilterResponseNormTlu2d: expected apply_act to be a bool, got {apply_act!r}")
        super().__init__()
        self.apply_act = apply_act
        self._init(num_features, eps, rms, device, dtype, tau=apply_act)
        self.reset_parameters()

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.filter_response_norm(input, self.weight, self.bias, self.tau, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, apply_act={self.apply_act}, eps={self.eps}"


class FilterResponseNormAct2d(_FRN):
    """Filter Response Normalization and an activation (timm's ``FilterResponseNormAct2d``):
    ``y = act(x / sqrt(mean_HW(x^2) + eps) * weight + bias)``.

    timm's constructor and defaults (``act_layer=nn.ReLU``, ``eps=1e-5``): ``act_layer`` is an
    activation name (``"relu"``, ``"silu"``, ``"gelu"``, ... as timm's ``create_act_layer`` knows
    them) or an ``nn.Module`` class, built as ``self.act`` (``nn.Identity`` when ``apply_act`` is
    False or ``act_layer`` None); ``state_dict`` keys ``weight``, ``bias`` (and the activation's,
    e.g. ``act.weight`` of a PReLU).

    >>> import torch, normlab
    >>> normlab.nn.FilterResponseNormAct2d(1)(torch.tensor([[[[3.0, -4.0]]]]))
    tensor([[[[0.8485, 0.0000]]]], grad_fn=<...>)
    """

    def __init__(self, num_features: int, apply_act: bool = True, act_layer=nn.ReLU, inplace: bool | None = None,
                 rms: bool = True, eps: float = 1e-5, device=None, dtype=None) -> None:
        cls = "FilterResponseNormAct2d"
        if not isinstance(apply_act, bool):
            raise TypeError(f"{cls}: expected apply_act to be a bool, got {apply_act!r}")
        act = make_act(cls, act_layer, inplace, device=device, dtype=dtype) \
            if act_layer is not None and apply_act else nn.Identity()
        super().__init__()
        self.act = act
        self._init(num_features, eps, rms, device, dtype, tau=False)
        self.reset_parameters()

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self.act(F.filter_response_norm(input, self.weight, self.bias, None, self.eps))

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
