"""Hugging Face transformers' norm classes as normlab modules: what ``normlab.convert`` knows of them.

Imported only when ``convert`` or ``revert`` first meets a class defined in
``transformers`` (``tools/integrations.py`` registers the finder), so
``import normlab`` never imports transformers.

transformers gives most models a norm class of their own, and these fall into
a few kinds by their math. Each kind has a reference class; every class whose
``forward`` is the same code as its reference's (compared as syntax trees,
docstrings left out) is of that kind -- the many classes that transformers
copies from Llama's are found that way, by their code rather than by a list:

=========  ===========================  ==================================================
kind       reference class              normlab module
=========  ===========================  ==================================================
llama      ``LlamaRMSNorm``             ``RMSNorm(casting="llama")``: ``w * x_hat.to(dtype)``
gemma      ``GemmaRMSNorm``             ``RMSNorm(casting="gemma", offset=1.0)``:
                                        ``(x_hat * (1 + w.float())).to(dtype)``
t5         ``T5LayerNorm``              ``RMSNorm(casting="llama")``
convnext   ``ConvNextLayerNorm``        ``LayerNorm2d`` (``data_format="channels_first"``) or ``LayerNorm``
=========  ===========================  ==================================================

The families normlab is tested with (``tests/tools/test_hf.py``): Llama, Mistral, Qwen2,
Qwen3 and Phi-3 (kind llama), Gemma 1, 2 and 3 (kind gemma), T5 (kind t5),
ConvNeXt (kind convnext: a ``torch.nn.LayerNorm`` subclass, permuted for
channels-first input; its copies serve ConvNeXt V2, SAM, DINOv3's ConvNeXt...).
GPT-NeoX and Falcon use ``torch.nn.LayerNorm`` itself, which convert swaps
anyway.

``eps`` is read from the module (``variance_epsilon`` or ``eps``), the weight
must be a 1-D ``Parameter`` (else the module is left alone), and the twin holds
that very ``Parameter`` under the same name, so ``state_dict`` keys do not
change. The original module rides along on the twin (not as a submodule: no
``state_dict`` entry), and ``revert`` gives it back with the twin's current
parameters and ``eps``.

One difference is documented rather than copied: a T5 norm whose weight has
another dtype than its input (a float32 weight on bfloat16 activations)
returns float32 there and ``w * x_hat.to(dtype)`` here (in a model cast to
one dtype, as ``from_pretrained(torch_dtype=...)`` gives, the two agree). And
normlab computes the statistics of a float64 input in float64, where these
classes round them to float32.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import numbers
import textwrap
from functools import partial

from torch import nn

from .conversion import adopt
from ..nn.layer_norm import LayerNorm, LayerNorm2d, RMSNorm

# kind -> (module of the reference class, its name, casting, offset, the attribute holding eps)
KINDS = {
    "llama": ("transformers.models.llama.modeling_llama", "LlamaRMSNorm", "llama", 0.0, "variance_epsilon"),
    "gemma": ("transformers.models.gemma.modeling_gemma", "GemmaRMSNorm", "gemma", 1.0, "eps"),
    "t5": ("transformers.models.t5.modeling_t5", "T5LayerNorm", "llama", 0.0, "variance_epsilon"),
    "convnext": ("transformers.models.convnext.modeling_convnext", "ConvNextLayerNorm", None, 0.0, "eps"),
}
_BASES = {"convnext": (nn.LayerNorm,)}  # the base class of each kind's classes (else nn.Module)

# The classes of the families the tests build real models of, by kind (each is recognised by
# its code like any other; the list says what is checked against transformers itself).
FAMILIES = {
    "llama": ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "Phi3RMSNorm"),
    "gemma": ("GemmaRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm"),
    "t5": ("T5LayerNorm",),
    "convnext": ("ConvNextLayerNorm",),
}

_ORIGINAL = "_normlab_original"  # the converted module, kept on its twin for revert
_fingerprints: dict = {}


def _fingerprint(cls: type) -> str | None:
    """The syntax tree of ``cls.forward``'s body, docstring left out; None when it has no
    readable source or takes other arguments than one input."""
    fn = cls.__dict__.get("forward")
    if fn is None:
        return None
    try:
        if len(inspect.signature(fn).parameters) != 2:  # (self, x): nothing else can change the math
            return None
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError, ValueError):
        return None
    node = tree.body[0]
    if not isinstance(node, ast.FunctionDef) or node.decorator_list:
        return None
    body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return ast.dump(ast.Module(body=body, type_ignores=[]))


def _reference_fingerprint(kind: str) -> str | None:
    if kind not in _fingerprints:
        module, name = KINDS[kind][:2]
        try:
            ref = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):  # a transformers without it: the kind is not known
            ref = None
        _fingerprints[kind] = None if ref is None else _fingerprint(ref)
    return _fingerprints[kind]


def kind_of(cls: type) -> str | None:
    """``"llama"``, ``"gemma"``, ``"t5"``, ``"convnext"``, or None for a class whose math normlab does not know."""
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        return None
    fp = _fingerprint(cls)
    if fp is None:
        return None
    for kind in KINDS:
        if cls.__bases__ == _BASES.get(kind, (nn.Module,)) and fp == _reference_fingerprint(kind):
            return kind
    return None


def conversion_for(cls: type):
    """``(to_normlab, from_normlab)`` for a transformers norm class, or None (the finder)."""
    kind = kind_of(cls)
    if kind is None:
        return None
    return partial(to_normlab, kind), partial(from_normlab, kind, cls)


def to_normlab(kind: str, m: nn.Module) -> nn.Module | None:
    """The normlab module computing what ``m`` (of ``kind``) computes, with ``m``'s own parameters."""
    if kind == "convnext":
        return _layer_norm_twin(m)
    _, _, casting, offset, eps_attr = KINDS[kind]
    w = m._parameters.get("weight")
    eps = getattr(m, eps_attr, None)
    if not isinstance(w, nn.Parameter) or w.dim() != 1 or not isinstance(eps, numbers.Real) or len(m._buffers):
        return None  # not the shape of module the kind's code expects: left alone
    twin = adopt(m, RMSNorm, normalized_shape=tuple(w.shape), eps=float(eps), casting=casting, offset=offset,
                 dtype=w.dtype)
    twin.__dict__[_ORIGINAL] = m  # a plain attribute: no submodule, no state_dict entry
    return twin


def _layer_norm_twin(m: nn.Module) -> nn.Module | None:
    """ConvNeXt's LayerNorm: channels-first -> LayerNorm2d, channels-last -> LayerNorm."""
    shape = tuple(m.normalized_shape)
    has_bias = m.bias is not None if m.weight is not None else True
    if m.data_format == "channels_first":
        if len(shape) != 1 or not has_bias:  # LayerNorm2d: one channel dim, weight and bias together
            return None
        twin = adopt(m, LayerNorm2d, num_channels=shape[0], eps=m.eps, affine=m.elementwise_affine)
    elif m.data_format == "channels_last":
        twin = adopt(m, LayerNorm, normalized_shape=shape, eps=m.eps, elementwise_affine=m.elementwise_affine,
                     bias=has_bias)
    else:
        return None
    twin.__dict__[_ORIGINAL] = m
    return twin


def from_normlab(kind: str, cls: type, twin: nn.Module) -> nn.Module | None:
    """The ``cls`` module ``twin`` was converted from, holding ``twin``'s parameters and ``eps``."""
    eps_attr = KINDS[kind][4]
    old = twin.__dict__.get(_ORIGINAL)
    if type(old) is not cls:  # never converted here (e.g. a copy without it)
        if kind == "convnext":
            return None  # left as it is: its data_format is not known
        old = cls.__new__(cls)  # a bare instance
        nn.Module.__init__(old)
    for name, p in twin._parameters.items():  # the twin's Parameters (a .to() may have made new ones)
        old._parameters[name] = p
    setattr(old, eps_attr, twin.eps)
    return old
