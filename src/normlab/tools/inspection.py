"""Inspect a model's normalization layers: what each computes, whether it *measurably*
depends on the batch, the health of its running statistics, and the usual pitfalls.

``inspect(model, example_input)`` runs the model once on ``example_input`` (in the mode
it is in), with hooks that record each norm layer's input, and then, for each layer, on a
copy of the layer:

- **sample 0 vs the others**: sample 0's output with its batch as given, and with every
  other sample replaced (scaled, shifted and perturbed). Any change means the layer mixes
  samples: BatchNorm in training mode, or in eval mode without running statistics.
- **batch 1 vs N**: sample 0's output alone and inside its batch.

Nothing the model holds changes: every buffer (running statistics, ``num_batches_tracked``)
and every train/eval flag is put back after the forward, and the measurements run on
copies. Works on torch.nn and normlab layers alike (BatchRenorm and GhostBatchNorm as
BatchNorm, LayerNorm2d and the channels-first LayerNorms of timm and transformers as
``layer2d``: statistics over dim 1), without converting anything.

Warnings, each with its fix: a BatchNorm in training mode inside a model in eval mode; a
batch of one sample reaching a training BatchNorm; a Linear/Conv bias right before a
BatchNorm (the mean subtraction cancels it); running statistics never updated, NaN or
Inf; ``track_running_stats=False`` in eval.

The table is drawn by ``inspection_table.py``; the command
``normlab inspect MODULE:FACTORY --input-shape 8,3,32,32`` is ``inspect_command.py``.

>>> import torch, normlab
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.LayerNorm(8))
>>> report = normlab.inspect(model, torch.randn(6, 4), show=False)
>>> [(layer.name, layer.batch_dependent) for layer in report.layers]
[('1', True), ('2', False)]
>>> sorted(w.problem.split(':')[0] for w in report.warnings)
['bias before BatchNorm', 'model in training mode']
"""

from __future__ import annotations

import copy
import dataclasses
import math
import weakref

import torch
from torch import nn

from .. import _extras
from .models import as_args, check_model, clear_hooks, preserved_state, shapes
from .norm_layers import norm_family

__all__ = ["inspect", "InspectReport", "LayerReport", "Pitfall"]

_NEAR_ZERO_VAR = 1e-6  # a channel with less variance than this is (nearly) constant: dead
_HUGE_VAR = 1e6
_DIMS = {2: "N,C", 3: "N,C,L", 4: "N,C,H,W", 5: "N,C,D,H,W"}


@dataclasses.dataclass
class Pitfall:
    """One warning of :func:`inspect`: the ``layer``'s name, the ``problem`` and its ``fix``."""
    layer: str
    problem: str
    fix: str


@dataclasses.dataclass
class LayerReport:
    """One norm layer as :func:`inspect` measured it (one row of the table; see the field comments)."""
    name: str
    cls: str
    family: str          # batch (BatchRenorm, GhostBatchNorm too), frozen, layer, layer2d, rms, group, instance
    mode: str            # train, eval
    input_shape: list | None
    calls: int
    axes: list | None    # input dims a statistic is computed over, at run time (None: fixed statistics)
    axes_text: str
    params: dict
    batch_dependent: bool | None = None   # either of the two below
    others_changed: bool | None = None    # sample 0's output changes when the other samples change
    batch_size_changed: bool | None = None  # sample 0's output alone differs from inside its batch
    others_diff: float | None = None      # max |change| of sample 0's output when the others change
    batch_size_diff: float | None = None  # max |change| of sample 0's output, alone vs in its batch (None: fails)
    measure_note: str = ""
    running: dict | None = None


@dataclasses.dataclass
class InspectReport:
    """What :func:`inspect` found: ``model`` (its class name), ``model_mode`` (train/eval),
    ``input_shape``, ``layers`` (a ``LayerReport`` per norm layer) and ``warnings`` (``Pitfall``
    records: ``layer``, ``problem``, ``fix``). ``str(report)`` is the table; ``to_dict()`` plain
    data for JSON.

    >>> import torch, normlab
    >>> report = normlab.inspect(torch.nn.Sequential(torch.nn.GroupNorm(2, 4)), torch.randn(2, 4, 3), show=False)
    >>> report.model, report.model_mode, report.input_shape, report.warnings
    ('Sequential', 'train', '[2, 4, 3]', [])
    """
    model: str
    model_mode: str
    input_shape: str
    layers: list
    warnings: list

    def to_dict(self) -> dict:
        """Plain data for JSON: a NaN or Inf number becomes None."""
        def clean(v):
            if isinstance(v, float) and not math.isfinite(v):
                return None
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            if isinstance(v, list):
                return [clean(x) for x in v]
            return v
        return clean(dataclasses.asdict(self))

    def __str__(self) -> str:
        from .inspection_table import render

        return render(self.to_dict())

    def __rich__(self):
        from .inspection_table import renderables

        return renderables(self.to_dict())


# --- what a layer computes ---------------------------------------------------------------


def _uses_input_stats(m: nn.Module, family: str) -> bool:
    if family == "batch":
        return m.training or m.running_mean is None
    if family == "instance":
        return m.training or m.running_mean is None  # its own (per-instance) statistics
    return family in ("layer", "layer2d", "rms", "group")


def _axes(m: nn.Module, family: str, shape) -> tuple[list | None, str]:
    r = len(shape) if shape is not None else None
    names = _DIMS[r].split(",") if r in _DIMS else []  # other ranks: dims by number

    def named(dims):
        return ",".join(names[d] if names else str(d) for d in dims)

    if family == "frozen":
        return None, "none (frozen)"
    if family in ("batch", "instance") and not _uses_input_stats(m, family):
        return None, "none (running stats)"
    if r is None:
        return None, "not reached"
    if family == "batch":
        dims = [0, *range(2, r)]
        v = getattr(m, "virtual_batch_size", None)  # GhostBatchNorm: N in virtual batches
        if v is not None:
            return dims, f"{named(dims)} per channel and virtual batch of {v}"
        return dims, f"{named(dims)} per channel"
    if family == "layer2d":
        return [1], f"{named([1])} per sample+position"
    if family == "instance":
        dims = list(range(2, r))
        return dims, f"{named(dims)} per sample+channel"
    if family == "group":
        dims = list(range(1, r))
        return dims, ",".join(["C/G", *([named(dims[1:])] if r > 2 else [])]) + " per sample+group"
    k = len(m.normalized_shape)
    dims = list(range(r - k, r))
    return dims, f"last {k} dim{'s' if k > 1 else ''} per sample"


def _params(m: nn.Module, family: str) -> dict:
    p: dict = {}
    if family in ("layer", "layer2d", "rms"):
        p["normalized_shape"] = list(m.normalized_shape)
    elif family == "group":
        p["num_groups"], p["num_channels"] = m.num_groups, m.num_channels
    else:
        p["num_features"] = m.num_features
    p["eps"] = m.eps
    if family in ("batch", "instance"):
        p["momentum"] = m.momentum
        p["track_running_stats"] = m.track_running_stats
    for extra in ("virtual_batch_size", "r_max", "d_max", "warmup_steps"):  # GhostBatchNorm, BatchRenorm
        if hasattr(m, extra) and family == "batch":
            p[extra] = getattr(m, extra)
    p["affine"] = getattr(m, "weight", None) is not None and family != "frozen"
    p["parameters"] = sum(t.numel() for t in m.parameters(recurse=False))
    return p


def _running(m: nn.Module, family: str) -> dict | None:
    rm, rv = getattr(m, "running_mean", None), getattr(m, "running_var", None)
    if rm is None or rv is None:
        return None
    rm, rv = rm.detach().double(), rv.detach().double()
    bad = int((~torch.isfinite(rm)).sum() + (~torch.isfinite(rv)).sum())
    ok = torch.isfinite(rv)
    nbt = getattr(m, "num_batches_tracked", None)
    return {
        "nan_inf": bad,
        "negative_var": int((rv[ok] < 0).sum()),
        "near_zero_var": int(((rv[ok] >= 0) & (rv[ok] < _NEAR_ZERO_VAR)).sum()),
        "huge_var": int((rv[ok] > _HUGE_VAR).sum()),
        "min_var": float(rv[ok].min()) if ok.any() else None,
        "max_var": float(rv[ok].max()) if ok.any() else None,
        "initial": bool(torch.all(rm == 0) and torch.all(rv == 1)),
        "num_batches_tracked": int(nbt) if nbt is not None else None,
        "momentum": getattr(m, "momentum", None) if family != "frozen" else None,
    }


# --- measured batch dependence -----------------------------------------------------------


def _bare_copy(m: nn.Module) -> nn.Module:
    c = copy.deepcopy(m)
    clear_hooks(c)  # the user's hooks must not fire on our copies
    return c


def _measure(layer: LayerReport, m: nn.Module, x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or not x.is_floating_point():
        layer.measure_note = "input is not a floating-point tensor: not measured"
        return
    g = torch.Generator(device=x.device).manual_seed(0)
    if x.shape[0] < 2:  # a batch of one: measure in a batch of four built around it
        x = torch.cat([x, *(x * (2 + i) + 1 for i in range(3))])
    others = x.clone()
    noise = torch.randn(others[1:].shape, generator=g, device=x.device, dtype=x.dtype)
    others[1:] = x[1:] * 2 + 1 + noise
    c = _bare_copy(m)
    with torch.no_grad():
        y = c(x)
        if not bool(torch.isfinite(y[0]).all()):
            layer.measure_note = "its output holds NaN/Inf: batch dependence not measured"
            return
        tol = 1e-5 * max(float(y[0].abs().max()), 1e-12)  # float rounding stays far below this
        layer.others_diff = float((c(others)[0] - y[0]).abs().max())
        layer.others_changed = layer.others_diff > tol
        try:
            layer.batch_size_diff = float((c(x[:1])[0] - y[0]).abs().max())
            layer.batch_size_changed = layer.batch_size_diff > tol
        except (ValueError, RuntimeError) as e:  # a training BatchNorm without spatial dims
            layer.batch_size_changed = True
            layer.measure_note = f"fails on a batch of 1: {str(e).splitlines()[0]}"
    layer.batch_dependent = layer.others_changed or layer.batch_size_changed


# --- the pitfalls ------------------------------------------------------------------------


def _pitfalls(layers: list, model_training: bool, one_sample: set, bias_before: dict) -> list:
    out = []
    if model_training and any(layer.family == "batch" and layer.mode == "train" for layer in layers):
        out.append(Pitfall("(the model)", "model in training mode: its BatchNorm layers normalise with each "
                           "batch's statistics, so a sample's output depends on its batch (right for training, "
                           "wrong for evaluation)",
                           "call model.eval() before evaluating (normlab inspect: --eval)"))
    for layer in layers:
        r = layer.running
        if layer.family == "batch" and layer.mode == "train" and not model_training:
            out.append(Pitfall(layer.name, "BatchNorm in training mode inside a model in eval mode: it normalises "
                               "with each batch's statistics (outputs depend on the batch) and moves its running "
                               "statistics during evaluation",
                               "call model.eval() after any .train() on a submodule, or freeze it for good: "
                               "normlab.freeze_batch_norm(model)"))
        if layer.name in one_sample:
            out.append(Pitfall(layer.name, "batch of 1 reaches a training BatchNorm: the batch statistics are one "
                               "sample's (or fail: 'Expected more than 1 value per channel')",
                               "train with batches of 2 or more samples, evaluate with model.eval(), or use a "
                               "batch-independent norm (GroupNorm, LayerNorm) or normlab.freeze_batch_norm"))
        if layer.name in bias_before:
            out.append(Pitfall(layer.name, f"bias before BatchNorm: {bias_before[layer.name]!r} adds a per-channel "
                               f"bias that the BatchNorm's mean subtraction removes again (its beta does that job)",
                               f"create {bias_before[layer.name]!r} with bias=False"))
        if layer.family == "batch" and layer.mode == "eval" and layer.params.get("track_running_stats") is False:
            out.append(Pitfall(layer.name, "track_running_stats=False in eval: with no running statistics the "
                               "layer normalises with each batch's statistics even in eval, so outputs depend "
                               "on the batch",
                               "create it with track_running_stats=True and train it or run "
                               "normlab.recalibrate_batch_norm(model, batches)"))
        if r is None:
            continue
        stale = r["initial"] and (r["num_batches_tracked"] in (None, 0))
        if stale and (layer.family == "frozen" or layer.mode == "eval"):
            out.append(Pitfall(layer.name, "running statistics never updated: still the initial mean 0 and "
                               "variance 1, so eval normalises with numbers that describe no data",
                               "train the model, load its checkpoint, or run "
                               "normlab.recalibrate_batch_norm(model, batches)"))
        if r["nan_inf"] or r["negative_var"]:
            out.append(Pitfall(layer.name, f"running statistics broken: {r['nan_inf']} NaN/Inf and "
                               f"{r['negative_var']} negative variance(s)",
                               "find the batch that diverged (lower the learning rate); then "
                               "normlab.recalibrate_batch_norm(model, batches) recomputes them"))
    return out


# --- inspect -----------------------------------------------------------------------------


def _mode(model: nn.Module) -> str:
    flags = {m.training for m in model.modules()}
    return "mixed" if len(flags) > 1 else ("train" if flags.pop() else "eval")


def inspect(model: nn.Module, example_input, *, show: bool = True) -> InspectReport:
    """Report every norm layer of ``model`` when run on ``example_input`` (a tensor, or a tuple
    of the model's positional inputs; dim 0 of each layer's input is taken as the batch).

    For each layer: its class and family, the input dims its statistics are taken over, its
    parameters, whether sample 0's output *measurably* depends on the rest of the batch (the
    others replaced; batch 1 vs N), the health of its running statistics, and pitfalls with
    their fix (BatchNorm training inside an eval model, a batch of one, a bias right before a
    BatchNorm, running statistics never updated or non-finite, ``track_running_stats=False`` in
    eval). No torch.nn counterpart. Works on torch.nn and normlab layers alike.

    Prints the table (rich) unless ``show=False``; returns an :class:`InspectReport`
    (``.layers``, ``.warnings``, ``.to_dict()`` for JSON). The model's buffers and modes are
    left exactly as they were (the measurements run on copies). Also ``normlab inspect``.

    >>> import torch, normlab
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.LayerNorm(8))
    >>> report = normlab.inspect(model, torch.randn(6, 4), show=False)
    >>> [(layer.name, layer.cls, layer.batch_dependent) for layer in report.layers]
    [('1', 'torch.BatchNorm1d', True), ('2', 'torch.LayerNorm', False)]
    """
    fn = "inspect"
    check_model(fn, model)
    args = as_args(example_input)
    if not any(isinstance(a, torch.Tensor) for a in args):
        raise TypeError(f"{fn}: expected example_input to be a tensor or a tuple of the model's inputs, "
                        f"got {type(example_input).__name__}")
    norms = [(name or "(the model)", m) for name, m in model.named_modules() if norm_family(m)]
    inputs, calls, one_sample, bias_before, producers = {}, {}, set(), {}, {}

    def pre_hook(name):
        def hook(m, a):
            calls[name] = calls.get(name, 0) + 1
            x = a[0] if a else None
            if name not in inputs and isinstance(x, torch.Tensor):
                inputs[name] = x.detach().clone()  # clone: a later in-place op must not change it
            if norm_family(m) == "batch" and m.training and isinstance(x, torch.Tensor) and x.dim() >= 2 \
                    and x.shape[0] == 1:
                one_sample.add(name)
            if norm_family(m) in ("batch", "frozen") and isinstance(x, torch.Tensor):
                made = producers.get(id(x))
                if made is not None and made[1]() is x:
                    layer = made[2]
                    per_channel = not isinstance(layer, nn.Linear) or x.dim() == 2
                    if layer.bias is not None and per_channel:
                        bias_before[name] = made[0]
        return hook

    def post_hook(name):
        def hook(m, a, out):
            if isinstance(out, torch.Tensor):
                producers[id(out)] = (name, weakref.ref(out), m)
        return hook

    handles = [m.register_forward_pre_hook(pre_hook(name)) for name, m in norms]
    handles += [m.register_forward_hook(post_hook(name)) for name, m in model.named_modules()
                if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd))]
    failure = None
    try:
        with preserved_state(model), torch.no_grad():
            model(*args)
    except Exception as e:  # noqa: BLE001
        # a batch of one in a training BatchNorm is a finding, not an input error
        if not (one_sample and "Expected more than 1 value per channel" in str(e)):
            raise ValueError(
                f"{fn}: the model failed on example_input of shape {shapes(args)}: {type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}. Pass an input of the shape the model expects "
                f"(from the command line: --input-shape N,C,H,W)") from e
        failure = str(e).splitlines()[0]
    finally:
        for h in handles:
            h.remove()

    layers = []
    for name, m in norms:
        family = norm_family(m)
        x = inputs.get(name)
        shape = list(x.shape) if x is not None else None
        axes, axes_text = _axes(m, family, shape)
        layer = LayerReport(name=name, cls=f"{type(m).__module__.split('.')[0]}.{type(m).__name__}",
                            family=family, mode="train" if m.training else "eval", input_shape=shape,
                            calls=calls.get(name, 0), axes=axes, axes_text=axes_text,
                            params=_params(m, family), running=_running(m, family))
        if x is None:
            layer.measure_note = "not reached" + (f" (the forward stopped: {failure})" if failure else "")
        else:
            _measure(layer, m, x)
        layers.append(layer)
    report = InspectReport(model=type(model).__name__, model_mode=_mode(model), input_shape=shapes(args),
                           layers=layers, warnings=_pitfalls(layers, model.training, one_sample, bias_before))
    if show:
        console = _extras.require("rich.console", "normlab.inspect(show=True)").Console()
        if console.is_terminal:
            console.print(report)
        else:                   # a pipe or a log: $COLUMNS or 80 columns, a block per layer if narrow
            print(str(report))
    return report
