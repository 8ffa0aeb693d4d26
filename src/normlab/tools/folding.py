"""Fold normalization layers into their neighbours, for inference.

``fold(model, example_input)`` returns a copy of ``model`` (a ``torch.fx.GraphModule``
traced from it; ``model`` itself is untouched) in which

- every eval-mode BatchNorm (torch's, normlab's, or a frozen one) whose input is the
  output of a ``Conv1d/2d/3d``, ``ConvTranspose1d/2d/3d`` or ``Linear``, and of nothing
  else, is folded into that layer's weight and bias and removed;
- every LayerNorm/RMSNorm whose output goes only to ``Linear`` layers has its affine
  (weight and bias) folded into those Linears and is left without one;
- every LayerNorm2d (normlab's, timm's) whose output goes only to 1x1 ``Conv2d`` layers
  without padding has its affine folded into those convs, likewise.

BatchRenorm and GhostBatchNorm fold as BatchNorm: their eval is BatchNorm's eval.

The math (derived in ``docs/lifecycle.md``). In eval mode BatchNorm is per channel
``y = s * z + t`` with ``s = gamma / sqrt(running_var + eps)`` and
``t = beta - running_mean * s``. If ``z = conv(x; W, b)``, output channel ``o`` is a sum
over the weights ``W`` that produce channel ``o`` plus ``b[o]``, so::

    W'[weights of channel o] = s[o] * W[weights of channel o],   b' = s * b + t

- Conv: ``W`` is ``(out, in / groups, *k)``: channel ``o`` is row ``W[o]``, whatever ``groups``.
- Linear: ``W`` is ``(out, in)``: row ``W[o]``; the BatchNorm's channel dim must be the
  Linear's last dim, so only a 2-D ``(N, out)`` Linear output qualifies.
- ConvTranspose: ``W`` is ``(in, out / groups, *k)``. Output channel ``o = g * (out / groups)
  + j`` of group ``g`` is made by ``W[i, j]`` for the input channels ``i`` of group ``g``,
  so ``W`` viewed as ``(groups, in / groups, out / groups, *k)`` is scaled by ``s`` viewed
  as ``(groups, 1, out / groups, 1, ...)``.

A LayerNorm/RMSNorm ``y = n(x) * gamma + beta`` (RMSNorm: no ``beta``) over the last dim
``D`` feeding ``Linear(D, out)``: ``W y + b = (W diag(gamma)) n(x) + (W beta + b)``, so
``W' = W * gamma`` (column ``j`` scaled by ``gamma[j]``) and ``b' = b + W beta``. A
LayerNorm2d normalises the ``C`` channels of each pixel, and a 1x1 conv is a Linear over
those channels at each pixel: the same fold, per group of the conv's input channels
(padding would add zeros that the shift ``W beta`` never reached, so none is allowed).

Every fold is computed in float64 and rounded once to the layer's dtype. What cannot be
folded is listed, with the reason, in ``folded.fold_report`` (and a warning): a BatchNorm
in training mode or without running statistics, a layer whose output also goes
elsewhere, a layer called more than once, a model ``torch.fx`` cannot trace (then each
submodule is traced and folded on its own, so what can be folded still is).

>>> import torch, normlab
>>> model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU()).eval()
>>> x = torch.randn(2, 3, 8, 8)
>>> folded = normlab.fold(model, x)
>>> [type(m).__name__ for m in folded.children()]
['Conv2d', 'ReLU']
>>> torch.allclose(folded(x), model(x), atol=1e-5)
True
"""

from __future__ import annotations

import copy
import dataclasses
import warnings

import torch
from torch import nn

from ..nn.layer_norm import LayerNorm2d
from .models import as_args, check_model, preserved_state, shapes
from .norm_layers import norm_family
from .timm import kind_of

__all__ = ["fold", "FoldReport"]

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_CONV_T = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
_PRODUCERS = "a Conv1d/2d/3d, ConvTranspose1d/2d/3d or Linear"


@dataclasses.dataclass
class FoldReport:
    """What :func:`fold` did: ``folded`` as ``(norm, into)`` pairs of module names,
    ``not_folded`` as ``(name, reason)`` pairs, and ``max_rel_err``, the largest difference
    between the copy's and the model's outputs on ``example_input`` relative to the largest
    output (None when some module is in training mode, so the outputs are not comparable).
    ``str(report)`` gives one line each.

    >>> import torch, normlab
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).eval()
    >>> print(normlab.fold(model, torch.randn(3, 4)).fold_report)  # doctest: +ELLIPSIS
    folded 1 into 0
    largest output difference on example_input: ... (relative)
    """

    folded: list = dataclasses.field(default_factory=list)
    not_folded: list = dataclasses.field(default_factory=list)
    max_rel_err: float | None = None
    blocked: list = dataclasses.field(default_factory=list)  # not_folded entries worth a warning

    def __str__(self) -> str:
        lines = [f"folded {norm} into {into}" for norm, into in self.folded]
        lines += [f"not folded {name}: {why}" for name, why in self.not_folded]
        if self.max_rel_err is not None:
            lines.append(f"largest output difference on example_input: {self.max_rel_err:.2e} (relative)")
        return "\n".join(lines) or "nothing to fold"


class _Tracer(torch.fx.Tracer):
    """torch.nn's layers and every norm layer (normlab's included) stay whole, as call_module."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return (norm_family(m) is not None or type(m).__module__.startswith("normlab.nn")
                or super().is_leaf_module(m, qualname))


def _trace(module: nn.Module) -> torch.fx.GraphModule:
    graph = _Tracer().trace(module)
    gm = torch.fx.GraphModule(module, graph, type(module).__name__)
    gm.training = module.training  # the flag of the root only: children keep their own
    return gm


def _describe(node) -> str:
    if not isinstance(node, torch.fx.Node):
        return f"a constant ({type(node).__name__})"
    if node.op == "call_module":
        return f"{node.target!r}"
    if node.op == "placeholder":
        return f"the input {node.target!r}"
    return f"{node.op} {getattr(node.target, '__name__', node.target)!s}"


def _users(node) -> str:
    return ", ".join(_describe(u) if u.op != "output" else "the output" for u in node.users)


def _called_often(target: str, calls: dict) -> str:
    return f"{target!r} is called {calls[target]} times in the forward: folding would change every call"


def _bn_scale_shift(bn: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """``s = gamma / sqrt(var + eps)``, ``t = beta - mean * s``, in float64."""
    mean, var = bn.running_mean.double(), bn.running_var.double()
    s = torch.rsqrt(var + bn.eps)
    if bn.weight is not None:
        s = s * bn.weight.detach().double()
    t = -mean * s
    if bn.bias is not None:
        t = t + bn.bias.detach().double()
    return s, t


def _scale_out_channels(layer: nn.Module, s: torch.Tensor) -> torch.Tensor:
    """The producer's weight with every output channel ``o`` scaled by ``s[o]`` (float64)."""
    w = layer.weight.detach().double()
    k = w.dim() - 2  # spatial dims of the kernel (0 for Linear)
    if isinstance(layer, _CONV_T):
        g = layer.groups
        return (w.view(g, w.shape[0] // g, w.shape[1], *w.shape[2:])
                * s.view(g, 1, -1, *([1] * k))).view(w.shape)
    return w * s.view(-1, *([1] * (w.dim() - 1)))


def _set_weight_bias(layer: nn.Module, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Write the folded float64 ``weight`` and ``bias`` (None: no bias needed) into ``layer``."""
    with torch.no_grad():
        layer.weight.copy_(weight.to(layer.weight.dtype))
        if bias is None:
            return
        if layer.bias is None:  # a layer made with bias=False gets one: the shift must live somewhere
            layer.bias = nn.Parameter(bias.to(layer.weight.dtype), requires_grad=layer.weight.requires_grad)
        else:
            layer.bias.copy_(bias.to(layer.bias.dtype))


def _why_not_bn(node, bn, modules, calls) -> str | None:
    """None when ``node`` (a BatchNorm call) can be folded into the layer before it."""
    if norm_family(bn) == "batch":
        if bn.training:
            return ("in training mode: it normalises each batch with that batch's own statistics, "
                    "which no fixed weight can hold; call model.eval() before fold")
        if bn.running_mean is None:
            return "track_running_stats=False: it uses each batch's own statistics even in eval"
    if len(node.args) != 1 or node.kwargs:
        return "called with more than one argument"
    prev = node.args[0]
    layer = modules.get(prev.target) if isinstance(prev, torch.fx.Node) and prev.op == "call_module" else None
    if not isinstance(layer, (*_CONV, *_CONV_T, nn.Linear)):
        return f"its input comes from {_describe(prev)}, not from {_PRODUCERS}"
    if len(prev.users) > 1:
        return (f"the output of {prev.target!r} is also used by {_users(prev)}: "
                f"folding would change what those see")
    if calls[prev.target] > 1:
        return _called_often(prev.target, calls)
    if isinstance(layer.weight, nn.parameter.UninitializedParameter):
        return f"{prev.target!r} is a lazy layer not yet initialised"
    out = layer.out_features if isinstance(layer, nn.Linear) else layer.out_channels
    if out != bn.num_features:
        return f"{prev.target!r} has {out} outputs but the BatchNorm has {bn.num_features} channels"
    meta = prev.meta.get("tensor_meta")
    want = 2 if isinstance(layer, nn.Linear) else layer.weight.dim()
    if meta is None or not hasattr(meta, "shape"):
        return f"the shape of {prev.target!r}'s output is unknown (the module was not run with example_input)"
    if len(meta.shape) != want:
        return (f"{prev.target!r}'s output has shape {list(meta.shape)}: the BatchNorm's channel dim 1 is not "
                f"the layer's output-channel dim" + (" (a Linear folds only for (N, features) output)"
                                                      if isinstance(layer, nn.Linear) else ""))
    return None


def _fold_bn(node, bn, modules, gm) -> str:
    prev = node.args[0]
    layer = modules[prev.target]
    s, t = _bn_scale_shift(bn)
    b = layer.bias.detach().double() if layer.bias is not None else torch.zeros_like(s)
    _set_weight_bias(layer, _scale_out_channels(layer, s), s * b + t)
    node.replace_all_uses_with(prev)
    gm.graph.erase_node(node)
    return prev.target


def _why_not_rows(node, norm, modules, calls) -> str | None:
    """None when the affine of ``node`` (a LayerNorm/RMSNorm call) can go into the Linears after it."""
    if norm.weight is None and getattr(norm, "bias", None) is None:
        return "no affine (weight, bias) to fold"
    if calls[node.target] > 1:
        return f"called {calls[node.target]} times in the forward: its affine serves every call"
    if len(node.args) != 1 or node.kwargs:
        return "called with more than one argument"
    linears = [u for u in node.users if u.op == "call_module" and isinstance(modules.get(u.target), nn.Linear)]
    others = [u for u in node.users if u not in linears]
    if others:
        many = f"used by {len(node.users)} consumers ({_users(node)})" if len(node.users) > 1 else \
            f"goes to {_users(node)}"
        return f"its output {many}, not only to Linear layers: folding the affine would change what they see"
    shape = tuple(norm.normalized_shape)
    for u in linears:
        lin = modules[u.target]
        if len(u.args) != 1 or u.args[0] is not node or u.kwargs:
            return f"{u.target!r} is called with other arguments"
        if calls[u.target] > 1:
            return _called_often(u.target, calls)
        if shape != (lin.in_features,):
            return (f"normalized_shape {list(shape)} is not the last dim of {u.target!r} "
                    f"(in_features={lin.in_features}): the affine does not line up with its inputs")
    return None


def _fold_rows(node, norm, modules) -> list[str]:
    gamma = norm.weight.detach().double() if norm.weight is not None else None
    offset = getattr(norm, "offset", 0.0)  # normlab's RMSNorm applies weight + offset (Gemma: 1)
    if gamma is not None and offset:
        gamma = gamma + offset
    beta = norm.bias.detach().double() if getattr(norm, "bias", None) is not None else None
    into = []
    for u in node.users:
        lin = modules[u.target]
        w = lin.weight.detach().double()  # (out, in)
        b = lin.bias.detach().double() if lin.bias is not None else None
        if beta is not None:  # b' = b + W beta, with the weight before scaling
            b = w @ beta if b is None else b + w @ beta
        _set_weight_bias(lin, w * gamma if gamma is not None else w, b)
        into.append(u.target)
    norm.weight = None
    if hasattr(norm, "bias"):
        norm.bias = None
    if offset:
        norm.offset = 0.0
    norm.elementwise_affine = False
    return into


def _is_pointwise_conv(layer) -> bool:
    """A Conv2d that mixes channels at each pixel only: 1x1 kernel, no padding."""
    return (type(layer) is nn.Conv2d and tuple(layer.kernel_size) == (1, 1)
            and (isinstance(layer.padding, str) or tuple(layer.padding) == (0, 0)))


def _why_not_channels(node, norm, modules, calls) -> str | None:
    """None when the affine of ``node`` (a LayerNorm2d call) can go into the 1x1 Conv2d layers after it."""
    if norm.weight is None and norm.bias is None:
        return "no affine (weight, bias) to fold"
    if not isinstance(norm, LayerNorm2d) and kind_of(type(norm)) != "LayerNorm2d":
        return (f"{type(norm).__name__} is another library's class whose forward fold does not change; "
                f"normlab.convert(model) first makes it a normlab LayerNorm2d, which folds")
    if calls[node.target] > 1:
        return f"called {calls[node.target]} times in the forward: its affine serves every call"
    if len(node.args) != 1 or node.kwargs:
        return "called with more than one argument"
    convs = [u for u in node.users if u.op == "call_module" and _is_pointwise_conv(modules.get(u.target))]
    others = [u for u in node.users if u not in convs]
    if others:
        many = f"used by {len(node.users)} consumers ({_users(node)})" if len(node.users) > 1 else \
            f"goes to {_users(node)}"
        return (f"its output {many}, not only to 1x1 Conv2d layers without padding: folding the affine "
                f"would change what they see")
    c = norm.normalized_shape[0]
    for u in convs:
        conv = modules[u.target]
        if len(u.args) != 1 or u.args[0] is not node or u.kwargs:
            return f"{u.target!r} is called with other arguments"
        if calls[u.target] > 1:
            return _called_often(u.target, calls)
        if conv.in_channels != c:
            return f"{u.target!r} takes {conv.in_channels} channels, the LayerNorm2d normalises {c}"
    return None


def _fold_channels(node, norm, modules) -> list[str]:
    """``conv(n(x) * gamma + beta)`` for a 1x1 conv, per group ``g`` of its input channels:
    ``W'[o, j] = W[o, j] * gamma[g, j]``, ``b'[o] = b[o] + sum_j W[o, j] * beta[g, j]``."""
    gamma = norm.weight.detach().double() if norm.weight is not None else None
    beta = norm.bias.detach().double() if norm.bias is not None else None
    into = []
    for u in node.users:
        conv = modules[u.target]
        g = conv.groups
        w = conv.weight.detach().double()  # (out, in / groups, 1, 1)
        wg = w.view(g, w.shape[0] // g, w.shape[1])  # (groups, out / groups, in / groups)
        b = conv.bias.detach().double() if conv.bias is not None else None
        if beta is not None:  # with the weight before scaling
            shift = (wg * beta.view(g, 1, -1)).sum(-1).reshape(-1)  # (out,)
            b = shift if b is None else b + shift
        if gamma is not None:
            w = (wg * gamma.view(g, 1, -1)).view(w.shape)
        _set_weight_bias(conv, w, b)
        into.append(u.target)
    norm.weight = None
    norm.bias = None
    if hasattr(norm, "affine"):
        norm.affine = False
    norm.elementwise_affine = False
    return into


def _fold_graph(gm: torch.fx.GraphModule, prefix: str, report: FoldReport) -> None:
    modules = dict(gm.named_modules())
    calls: dict = {}
    for n in gm.graph.nodes:
        if n.op == "call_module":
            calls[n.target] = calls.get(n.target, 0) + 1
    for node in list(gm.graph.nodes):
        if node.op != "call_module":
            continue
        m = modules[node.target]
        family, name = norm_family(m), prefix + node.target
        if family in ("batch", "frozen"):
            why = _why_not_bn(node, m, modules, calls)
            if why is None:
                report.folded.append((name, prefix + _fold_bn(node, m, modules, gm)))
            else:
                report.not_folded.append((name, why))
                report.blocked.append((name, why))
        elif family in ("layer", "rms", "layer2d"):  # an affine folded into the next Linear / 1x1 conv
            why_not, fold_into = ((_why_not_channels, _fold_channels) if family == "layer2d"
                                  else (_why_not_rows, _fold_rows))
            why = why_not(node, m, modules, calls)
            if why is None:
                report.folded.append((name, ", ".join(prefix + t for t in fold_into(node, m, modules))))
            else:
                report.not_folded.append((name, why))
                if m.weight is not None:
                    report.blocked.append((name, why))
        elif family is not None:
            report.not_folded.append((name, f"{type(m).__name__} computes its statistics from each input at run "
                                            f"time; fold handles BatchNorm and the LayerNorm/RMSNorm/LayerNorm2d "
                                            f"affine"))
    gm.graph.lint()
    gm.delete_all_unused_submodules()
    gm.recompile()


def _fold_tree(module: nn.Module, args, prefix: str, report: FoldReport, inputs: dict) -> nn.Module:
    """Trace and fold ``module``; if it cannot be traced, do the same inside each child."""
    try:
        gm = _trace(module)
    except Exception as e:  # noqa: BLE001 -- any tracing failure means: go one level down
        first = (str(e).strip().splitlines() or [""])[0][:200]
        report.not_folded.append((prefix.rstrip(".") or "(the model)",
                                  f"torch.fx cannot trace its forward ({type(e).__name__}: {first}); "
                                  f"its submodules are folded one by one instead"))
        report.blocked.append(report.not_folded[-1])
        tracer = _Tracer()
        for name, child in list(module._modules.items()):
            if child is None:
                continue
            path = prefix + name
            if tracer.is_leaf_module(child, path):
                if norm_family(child) in ("batch", "frozen", "layer", "layer2d", "rms"):
                    parent = prefix.rstrip(".") or "(the model)"
                    why = f"the layer before or after it is unknown: its parent {parent!r} could not be traced"
                    report.not_folded.append((path, why))
                    report.blocked.append((path, why))
                continue
            module._modules[name] = _fold_tree(child, inputs.get(id(child)), path + ".", report, inputs)
        return module
    if args is not None:
        from torch.fx.passes.shape_prop import ShapeProp

        try:
            with preserved_state(gm), torch.no_grad():
                ShapeProp(gm).propagate(*args)
        except Exception:  # noqa: BLE001 -- without shapes, folds that need them are reported, not made
            pass
    _fold_graph(gm, prefix, report)
    return gm


def _tensors(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return []


def _capture_inputs(model: nn.Module, args: tuple) -> dict:
    """The positional arguments of each submodule's first call, from one forward of ``model``."""
    seen: dict = {}
    handles = [m.register_forward_pre_hook(lambda mod, a: seen.setdefault(id(mod), a))
               for m in model.modules()]
    try:
        with preserved_state(model), torch.no_grad():
            model(*args)
    finally:
        for h in handles:
            h.remove()
    return seen


def fold(model: nn.Module, example_input) -> nn.Module:
    """An inference copy of ``model`` with BatchNorm folded into the Conv/ConvTranspose/Linear
    before it and LayerNorm/RMSNorm (LayerNorm2d) affines folded into the Linear (1x1 Conv2d)
    after them.

    BatchNorm in eval is ``y = s * z + t`` per channel, ``s = weight / sqrt(running_var + eps)``,
    ``t = bias - running_mean * s``; folded, the producing layer's ``W' = s * W`` (per output
    channel) and ``b' = s * b + t``. A norm affine ``n(x) * gamma + beta`` feeding ``Linear(W, b)``
    becomes ``W' = W * gamma`` (per input column), ``b' = b + W beta``. Each fold is computed in
    float64 and rounded once to the layer's dtype. Nearest torch counterpart:
    ``torch.nn.utils.fusion.fuse_conv_bn_eval`` (one pair, by hand); here the graph is traced
    (``torch.fx``) and every foldable pair is found. ``model`` itself is untouched.

    ``example_input``: a tensor (or a tuple of the model's positional inputs) the model
    accepts; used to check the input, to learn the layers' output shapes, and to compare
    the copy's output with the model's. Returns the copy (a ``torch.fx.GraphModule``, or
    the copied model with its traceable submodules folded when the whole cannot be
    traced), with a :class:`FoldReport` as its ``fold_report`` attribute; what cannot be folded
    (a BatchNorm in training mode or without running statistics, a layer whose output also goes
    elsewhere or that is called twice) is listed there with the reason, and warned about.
    Outputs match the model's eval outputs to float rounding (within 1e-5 relative in float32).

    >>> import torch, normlab
    >>> model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU()).eval()
    >>> x = torch.randn(2, 3, 8, 8)
    >>> folded = normlab.fold(model, x)
    >>> [type(m).__name__ for m in folded.children()], folded.fold_report.folded
    (['Conv2d', 'ReLU'], [('1', '0')])
    >>> torch.allclose(folded(x), model(x), atol=1e-5)
    True
    """
    fn = "fold"
    check_model(fn, model)
    args = as_args(example_input)
    work = copy.deepcopy(model)
    evaluating = not any(m.training for m in work.modules())
    try:
        with preserved_state(work), torch.no_grad():
            ref = work(*args)
    except Exception as e:
        raise ValueError(
            f"{fn}: the model failed on example_input of shape {shapes(args)}: {type(e).__name__}: {e}. "
            f"Pass an input the model accepts (a tensor, or a tuple of its positional inputs)"
        ) from e
    report = FoldReport()
    inputs: dict = {}
    try:
        _trace(work)
    except Exception:  # noqa: BLE001 -- untraceable: the children need their own example inputs
        inputs = _capture_inputs(work, args)
    out = _fold_tree(work, args, "", report, inputs)
    if evaluating:
        with torch.no_grad():
            got = _tensors(out(*args))
        want = _tensors(ref)
        errs = [((g.double() - w.double()).abs().max() / w.double().abs().max().clamp_min(1e-30)).item()
                for g, w in zip(got, want) if g.numel() and g.is_floating_point()]
        report.max_rel_err = max(errs, default=0.0)
        if report.max_rel_err > 1e-4:
            warnings.warn(f"{fn}: the folded copy's output differs from the model's by {report.max_rel_err:.2e} "
                          f"(relative) on example_input", stacklevel=2)
    if report.blocked:
        warnings.warn(f"{fn}: {len(report.blocked)} layer(s) not folded: "
                      + "; ".join(f"{n}: {w}" for n, w in report.blocked), stacklevel=2)
    out.fold_report = report
    return out
