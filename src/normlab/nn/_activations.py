"""The activation table of the norm+act modules: what timm's ``act_layer`` / ``act_kwargs`` /
``apply_act`` arguments may be, resolved to the activation Module a norm+act layer holds
(``.act``, as timm's do) and to the (name, parameter) pair ``normlab.functional``'s ``*_act``
functions take (``act=``, ``negative_slope=``).

Accepted, as timm's ``get_act_layer`` accepts them:

- a name, case-insensitive: ``"identity"``, ``"relu"``, ``"leaky_relu"``, ``"silu"`` (also
  ``"swish"``), ``"gelu"``, ``"gelu_tanh"``, ``"hard_swish"`` (also ``"hardswish"``),
  ``"tanh"``; ``None`` or ``""``: no activation (identity);
- a Module class: ``nn.Identity``, ``nn.ReLU``, ``nn.LeakyReLU``, ``nn.SiLU``, ``nn.GELU``
  (``approximate="none"`` or ``"tanh"``), ``nn.Hardswish``, ``nn.Tanh``, and timm's own
  ``GELU``, ``GELUTanh``, ``Tanh``, ``Swish``, ``HardSwish`` (``timm.layers.activations``);
- a Module instance of one of those classes (its ``negative_slope`` / ``approximate`` read).

``act_kwargs`` go to the class's constructor (``negative_slope=0.2``, ``approximate="tanh"``);
``inplace`` is accepted and kept on the Module (the fused kernels write a new output either way).
Anything else raises ``ValueError`` naming what is known.
"""

from __future__ import annotations

from torch import nn

# the activation names of normlab.functional's *_act functions
IDENTITY, RELU, LEAKY_RELU, SILU, GELU, GELU_TANH, HARDSWISH, TANH = (
    "identity", "relu", "leaky_relu", "silu", "gelu", "gelu_tanh", "hardswish", "tanh")
__all__ = ["KNOWN", "make_act", "act_of"]

# name -> (torch class, constructor kwargs)
_BY_NAME = {
    "identity": (nn.Identity, {}),
    "relu": (nn.ReLU, {}),
    "leaky_relu": (nn.LeakyReLU, {}),
    "silu": (nn.SiLU, {}),
    "swish": (nn.SiLU, {}),
    "gelu": (nn.GELU, {}),
    "gelu_tanh": (nn.GELU, {"approximate": "tanh"}),
    "hard_swish": (nn.Hardswish, {}),
    "hardswish": (nn.Hardswish, {}),
    "tanh": (nn.Tanh, {}),
}
KNOWN = tuple(_BY_NAME)
_TORCH_CLASSES = (nn.Identity, nn.ReLU, nn.LeakyReLU, nn.SiLU, nn.GELU, nn.Hardswish, nn.Tanh)
# timm.layers.activations' own classes (a thin Module over the torch function of the same math)
_TIMM_MODULE = "timm.layers.activations"
_TIMM_CLASSES = {"GELU": GELU, "GELUTanh": GELU_TANH, "Tanh": TANH, "Swish": SILU, "HardSwish": HARDSWISH}
_TORCH_IDS = {nn.Identity: IDENTITY, nn.ReLU: RELU, nn.SiLU: SILU, nn.Hardswish: HARDSWISH, nn.Tanh: TANH}
_FIX = "; or apply_act=False and the activation as a module of its own after the layer"
_KNOWN_WORDS = (f"names {', '.join(repr(n) for n in KNOWN)} (or None); classes or instances of "
                f"{', '.join('nn.' + c.__name__ for c in _TORCH_CLASSES)} and timm's "
                f"{', '.join(_TIMM_CLASSES)}{_FIX}")


def act_of(module) -> tuple[str, float] | None:
    """``(activation name, parameter)`` of an activation Module the kernels can apply, else None."""
    cls = type(module)
    act = _TORCH_IDS.get(cls)
    if act is not None:
        return act, 0.0
    if cls is nn.LeakyReLU:
        return LEAKY_RELU, float(module.negative_slope)
    if cls is nn.GELU:
        approximate = module.approximate
        return (GELU, 0.0) if approximate == "none" else (GELU_TANH, 0.0) if approximate == "tanh" else None
    if cls.__module__ == _TIMM_MODULE and cls.__qualname__ in _TIMM_CLASSES:
        return _TIMM_CLASSES[cls.__qualname__], 0.0
    return None


def _class_known(cls) -> bool:
    return cls in _TORCH_CLASSES or (cls.__module__ == _TIMM_MODULE and cls.__qualname__ in _TIMM_CLASSES)


def make_act(owner: str, act_layer, act_kwargs=None, inplace: bool = True, apply_act: bool = True) -> nn.Module:
    """The activation Module of a norm+act layer built with timm's arguments (``nn.Identity`` when
    ``apply_act`` is False or ``act_layer`` is None); ``ValueError`` for one the kernels do not know."""
    if not apply_act or act_layer is None or (isinstance(act_layer, str) and not act_layer):
        return nn.Identity()
    kwargs = dict(act_kwargs or {})
    if isinstance(act_layer, nn.Module):
        if kwargs:
            raise ValueError(f"{owner}: expected act_kwargs only with an act_layer name or class, got "
                             f"act_kwargs={kwargs!r} with the instance {act_layer!r}; put them in the instance")
        if act_of(act_layer) is None:
            raise ValueError(f"{owner}: unknown activation {act_layer!r}; expected one of: {_KNOWN_WORDS}")
        return act_layer
    if isinstance(act_layer, str):
        entry = _BY_NAME.get(act_layer.lower())
        if entry is None:
            raise ValueError(f"{owner}: unknown activation name {act_layer!r}; expected one of: {_KNOWN_WORDS}")
        cls, base = entry
        kwargs = {**base, **kwargs}
    elif isinstance(act_layer, type) and issubclass(act_layer, nn.Module):
        cls = act_layer
        if not _class_known(cls):
            raise ValueError(f"{owner}: unknown activation class {cls.__qualname__}; expected one of: {_KNOWN_WORDS}")
    else:
        raise TypeError(f"{owner}: expected act_layer to be a name, an activation Module class or instance, "
                        f"or None, got {type(act_layer).__name__}")
    kwargs.setdefault("inplace", inplace)
    try:
        module = cls(**kwargs)
    except TypeError:  # (a class without inplace, as timm retries)
        kwargs.pop("inplace")
        module = cls(**kwargs)
    if act_of(module) is None:
        raise ValueError(f"{owner}: unknown activation {module!r}; expected one of: {_KNOWN_WORDS}")
    return module
