"""LayerNorm, RMSNorm, their fused residual adds and LayerNorm2d as functions
(``normlab.functional``; the math: ``normlab.ops.layer_norm``): each public function judges its
arguments and runs the path ``normlab._backend.route`` decided.

The C++ ops (registered in ``csrc/layer_norm.h``): ``layer_norm_fwd``, ``rms_norm_fwd``,
``add_layer_norm_fwd``, ``add_rms_norm_fwd`` (forward with the (n_rows,) statistics,
differentiable; double backward through the reference formula in ATen), ``layer_norm_bwd``,
``rms_norm_bwd`` (backward) and ``row_norm_infer`` (the output alone); ``layer_norm2d`` (its
autograd, with a differentiable backward under ``create_graph=True``, C++ too: it reads a
contiguous (NCHW) or channels-last input without a copy and writes the output in the input's
layout).

The paths of the row norms:

- ``REF``: the reference math, ``reference.ref_layer_norm`` and its siblings;
- ``EAGER``: the C++ fast entries (``normlab._C.layer_norm_fast``, ...) on the arguments as given,
  else ``normlab._C.row_norm``: one C++ call that records autograd through the forward op when an
  input requires grad, and otherwise runs ``row_norm_infer``, which allocates only the output;
- ``COMPILE``: the forward ops through ``torch.ops.normlab`` (traced as single nodes);
- ``TRANSFORM``, torch.func transforms and forward-mode AD (a C++ ``autograd::Function`` refuses them):
  ``RowNormTransform``, a Python Function with the forward-mode rule and the vmap rule (a batch
  of row sets is one set of more rows; batched weights stay *grouped* weights), whose forward
  and backward call the same C++ ops.

LayerNorm2d's paths: ``REF``, ``reference.ref_layer_norm2d``; ``TRANSFORM`` (which refuses a C++
autograd function), LayerNorm's row path on ``x.movedim(1, -1)``, whose transform rules exist;
``COMPILE``, ``torch.ops.normlab.layer_norm2d``; ``EAGER``, the fast entry
``normlab._C.layer_norm2d_fast``, else the direct binding ``normlab._C.layer_norm2d`` (the same
registered op without the Python-level dispatch of ``torch.ops``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._backend import COMPILE, EAGER, REF, TRANSFORM, route
from .._checks import (check_eps, check_input, check_param, cpu_params_fit, normalized_shape_tuple, plain_eps,
                       rms_variant)
from ..ops import _register, _transforms
from ..ops import extension as _extension
from ..ops.layer_norm.reference import (layer_norm_backward_ref, layer_norm_stats, norm_jvp, ref_add_layer_norm,
                                        ref_add_rms_norm, ref_layer_norm, ref_layer_norm2d, ref_rms_norm,
                                        rms_eps, rms_norm_backward_ref, rms_norm_stats)
from ..ops.layouts import channels_as_rows, flat, output_memory_format, rows
from ..ops.numerics import acc_dtype, to_acc
from .checks import (check_channels_input, check_normalized_shape, check_per_channel, check_residual, residual_fits,
                     rows_fit)

_C = _extension.load()


def layer_norm(
    input: torch.Tensor,
    normalized_shape,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """LayerNorm over the trailing ``normalized_shape`` dims: ``y = (x - mean) / sqrt(var + eps) * weight + bias``.

    Twin: ``torch.nn.functional.layer_norm`` -- same signature; also takes an int
    ``normalized_shape``; ``weight``/``bias`` must have exactly ``normalized_shape`` (nothing
    broadcast), the input's dtype or float32 for float16/bfloat16 input.

    Shapes: input ``(*, *normalized_shape)``, output the same; ``weight``, ``bias``:
    ``normalized_shape`` or None.

    Numerics: mean and biased variance per row, accumulated in float32 for
    float16/bfloat16/float32 input and float64 for float64 (shifted two-pass); output cast
    to the input's dtype once.

    >>> import torch, normlab.functional as NF
    >>> NF.layer_norm(torch.tensor([[1.0, 2.0, 3.0]]), 3)
    tensor([[-1.2247,  0.0000,  1.2247]])
    """
    path = route(input, "layer_norm")
    if path == EAGER:  # the C++ entry judges the arguments as the checks below; None: not its case
        try:
            y = _C.layer_norm_fast(input, normalized_shape, weight, bias, eps)
        except TypeError:  # an argument of a type it does not take: the checks below say what
            y = None
        if y is not None:
            return y
    fn = "layer_norm"
    shape = normalized_shape
    if eps is None or not rows_fit(input, shape, eps, weight, bias):
        check_input(fn, input)
        shape = normalized_shape_tuple(fn, normalized_shape)
        check_normalized_shape(fn, input, shape)
        check_param(fn, "weight", weight, input, shape, "normalized_shape")
        check_param(fn, "bias", bias, input, shape, "normalized_shape")
        check_eps(fn, eps, none_ok=False)
    return _layer_norm_path(path, input, shape, weight, bias, float(eps))


def _other_float_dtype(weight, input) -> bool:
    return (isinstance(weight, torch.Tensor) and isinstance(input, torch.Tensor) and weight.dtype != input.dtype
            and weight.is_floating_point() and input.is_floating_point())


def rms_norm(
    input: torch.Tensor,
    normalized_shape,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    *,
    casting: str = "torch",
    offset: float = 0.0,
) -> torch.Tensor:
    """RMSNorm over the trailing ``normalized_shape`` dims: ``y = x / sqrt(mean(x^2) + eps) * weight``.

    Twin: ``torch.nn.functional.rms_norm`` -- same signature and results (``casting="torch"``,
    ``offset=0``). ``eps=None`` uses the machine epsilon of the accumulation dtype
    (``torch.finfo(torch.float32).eps`` for float16/bfloat16/float32 input).

    Shapes: input ``(*, *normalized_shape)``, output the same; ``weight``: ``normalized_shape`` or None.

    Numerics: ``mean(x^2)`` accumulated in float32 for float16/bfloat16/float32 input and
    float64 for float64. The variants of the models that use RMSNorm differ only in where the
    result is rounded:

    - ``casting="torch"`` (default): ``(x_hat * w).to(dtype)``, torch's ``rms_norm``;
      with a weight of another float dtype, ``(x_hat.to(dtype) * w).to(dtype)`` as torch.
    - ``casting="llama"``: ``w * x_hat.to(dtype)``: ``x_hat`` rounded to the input's dtype
      first; with a weight of another float dtype the output has the promoted dtype.
    - ``casting="gemma"``: ``(x_hat * w.float()).to(dtype)``: the weight of any float
      dtype taken in the accumulation dtype, one rounding at the end.
    - ``offset``: the weight is applied as ``w + offset`` (Gemma: ``offset=1.0``), the
      sum taken in the accumulation dtype.

    >>> import torch, normlab.functional as NF
    >>> NF.rms_norm(torch.tensor([[3.0, 4.0]]), (2,))
    tensor([[0.8485, 1.1314]])
    >>> x, w = torch.randn(4, 8).bfloat16(), torch.randn(8).bfloat16()
    >>> x_hat = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16()
    >>> torch.equal(NF.rms_norm(x, (8,), w, 1e-6, casting="llama"), w * x_hat)
    True
    """
    path = route(input, "rms_norm")
    if path == EAGER and casting == "torch" and offset == 0.0:
        try:
            y = _C.rms_norm_fast(input, normalized_shape, weight, eps)
        except TypeError:
            y = None
        if y is not None:
            return y
    fn = "rms_norm"
    shape = normalized_shape
    cast_x_hat, offset = rms_variant(fn, casting, offset, weight)
    if _other_float_dtype(weight, input):
        if casting != "gemma":
            return _rms_norm_other_weight(input, normalized_shape, weight, eps, casting, offset)
        weight = weight.to(acc_dtype(input.dtype))  # gemma: the weight in float32 (float64), whatever its dtype
    if not rows_fit(input, shape, eps, weight):
        check_input(fn, input)
        shape = normalized_shape_tuple(fn, normalized_shape)
        check_normalized_shape(fn, input, shape)
        check_param(fn, "weight", weight, input, shape, "normalized_shape")
        check_eps(fn, eps, none_ok=True)
    eps = None if eps is None else float(eps)
    return _rms_norm_path(path, input, shape, weight, eps, offset, cast_x_hat)


def _rms_norm_other_weight(input, normalized_shape, weight, eps, casting="torch", offset=0.0):
    """RMSNorm with a weight in another float dtype than the input: the normalised rows in the
    input's dtype times ``weight + offset`` in the promoted dtype -- rounded back to the input's
    dtype as torch does (``casting="torch"``: ``(x_hat.to(x.dtype) * w).to(x.dtype)``), or left in
    the promoted dtype (``"llama"``: ``w * x_hat.to(x.dtype)``)."""
    fn = "rms_norm"
    check_input(fn, input)
    shape = normalized_shape_tuple(fn, normalized_shape)
    check_normalized_shape(fn, input, shape)
    check_param(fn, "weight", weight.detach().to(input.dtype), input, shape, "normalized_shape")
    w = weight + offset if offset != 0.0 else weight
    y = rms_norm(input, shape, None, eps) * w
    return y if casting == "llama" else y.to(input.dtype)


def add_layer_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    normalized_shape,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add then LayerNorm, fused: returns ``(y, h)`` with ``h = x + residual``
    and ``y = layer_norm(h, normalized_shape, weight, bias, eps)``.

    No torch twin: ``torch.add`` then ``torch.nn.functional.layer_norm``, the pre-norm
    transformer step, in one pass over memory on the ``"cpu"`` backend.

    Shapes: ``x``, ``residual``: the same shape ``(*, *normalized_shape)``, dtype and device
    (nothing broadcast); ``y`` and ``h`` as ``x``.

    Numerics: ``h`` is rounded to the input dtype before it is normalised, exactly as
    ``torch.add`` followed by the norm; then :func:`layer_norm`'s numerics. Gradients reach
    ``x`` and ``residual`` through both outputs.

    >>> import torch, normlab.functional as NF
    >>> x, r = torch.randn(4, 6), torch.randn(4, 6)
    >>> y, h = NF.add_layer_norm(x, r, (6,))
    >>> torch.equal(h, x + r), torch.allclose(y, torch.nn.functional.layer_norm(x + r, (6,)), atol=1e-6)
    (True, True)
    """
    path = route(x, "add_layer_norm")
    if path == EAGER and eps is not None:  # (None is RMSNorm's default eps, not LayerNorm's)
        try:
            yh = _C.add_norm_fast(x, residual, normalized_shape, weight, bias, eps, True)
        except TypeError:
            yh = None
        if yh is not None:
            return yh
    fn = "add_layer_norm"
    shape = normalized_shape
    if eps is None or not (rows_fit(x, shape, eps, weight, bias) and residual_fits(x, residual)):
        check_input(fn, x)
        check_residual(fn, x, residual)
        shape = normalized_shape_tuple(fn, normalized_shape)
        check_normalized_shape(fn, x, shape)
        check_param(fn, "weight", weight, x, shape, "normalized_shape")
        check_param(fn, "bias", bias, x, shape, "normalized_shape")
        check_eps(fn, eps, none_ok=False)
    return _add_layer_norm_path(path, x, residual, shape, weight, bias, float(eps))


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    normalized_shape,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    *,
    casting: str = "torch",
    offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add then RMSNorm, fused: returns ``(y, h)`` with ``h = x + residual``
    and ``y = rms_norm(h, normalized_shape, weight, eps, casting=casting, offset=offset)``.

    No torch twin: ``torch.add`` then ``torch.nn.functional.rms_norm``, in one pass over memory
    on the ``"cpu"`` backend.

    Shapes: ``x``, ``residual``: the same shape ``(*, *normalized_shape)``, dtype and device
    (nothing broadcast); ``y`` and ``h`` as ``x``.

    Numerics: ``h`` is rounded to the input dtype first; then :func:`rms_norm`'s numerics
    (``eps=None``, ``casting`` and ``offset`` as there).

    >>> import torch, normlab.functional as NF
    >>> x, r = torch.randn(4, 6), torch.randn(4, 6)
    >>> y, h = NF.add_rms_norm(x, r, (6,), eps=1e-6)
    >>> torch.allclose(y, torch.nn.functional.rms_norm(x + r, (6,), eps=1e-6), atol=1e-6)
    True
    """
    path = route(x, "add_rms_norm")
    if path == EAGER and casting == "torch" and offset == 0.0:
        try:
            yh = _C.add_norm_fast(x, residual, normalized_shape, weight, None, eps, False)
        except TypeError:
            yh = None
        if yh is not None:
            return yh
    fn = "add_rms_norm"
    shape = normalized_shape
    cast_x_hat, offset = rms_variant(fn, casting, offset, weight)
    if _other_float_dtype(weight, x):
        if casting == "llama":  # the normalised h in x's dtype, times the weight in the promoted dtype
            shape = normalized_shape_tuple(fn, normalized_shape)
            check_normalized_shape(fn, x, shape)
            check_param(fn, "weight", weight.detach().to(x.dtype), x, shape, "normalized_shape")
            y, h = add_rms_norm(x, residual, shape, None, eps)
            return y * (weight + offset if offset != 0.0 else weight), h
        if casting == "gemma":
            weight = weight.to(acc_dtype(x.dtype))
    if not (rows_fit(x, shape, eps, weight) and residual_fits(x, residual)):
        check_input(fn, x)
        check_residual(fn, x, residual)
        shape = normalized_shape_tuple(fn, normalized_shape)
        check_normalized_shape(fn, x, shape)
        check_param(fn, "weight", weight, x, shape, "normalized_shape")
        check_eps(fn, eps, none_ok=True)
    eps = None if eps is None else float(eps)
    return _add_rms_norm_path(path, x, residual, shape, weight, eps, offset, cast_x_hat)


def layer_norm2d(
    input: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """LayerNorm over the channel dim 1 of an ``(N, C, *)`` input, at every position:
    ``y[n, :, h, w] = (x[n, :, h, w] - mean) / sqrt(var + eps) * weight + bias``.

    No torch twin: ``torch.nn.functional.layer_norm`` of ``x.permute(0, 2, 3, 1)`` over ``(C,)``,
    permuted back -- without the copies. A ``channels_last`` input is already ``(N * H * W, C)``
    rows in memory: LayerNorm's row kernel runs on it and the output is ``channels_last`` too; a
    contiguous (NCHW) input runs on kernels of its own and gives a contiguous output.

    Shapes: input ``(N, C, *)``, output the same; ``weight``, ``bias``: ``(C,)`` or None.

    Numerics: mean and biased variance over the ``C`` values of one position, accumulated in
    float32 for float16/bfloat16/float32 input and float64 for float64; output cast once.

    >>> import torch, normlab.functional as NF
    >>> x = torch.randn(2, 3, 4, 5)
    >>> ref = torch.nn.functional.layer_norm(x.permute(0, 2, 3, 1), (3,), eps=1e-6).permute(0, 3, 1, 2)
    >>> torch.allclose(NF.layer_norm2d(x), ref, atol=1e-6)
    True
    """
    path = route(input, "layer_norm2d")
    if path == EAGER:  # the C++ entry judges the arguments as the checks below; None: not its case
        try:
            y = _C.layer_norm2d_fast(input, weight, bias, eps)
        except TypeError:  # an argument of a type it does not take: the checks below say what
            y = None
        if y is not None:
            return y
    fn = "layer_norm2d"
    if not (  # the fast test first: a few attribute reads, then the checks that raise
        isinstance(input, torch.Tensor)
        and input.dim() >= 2
        and cpu_params_fit(input, input.shape[1:2], weight, bias)
        and eps is not None
        and plain_eps(eps)
    ):
        check_input(fn, input)
        check_channels_input(fn, input)
        check_per_channel(fn, input, weight=weight, bias=bias)
        check_eps(fn, eps, none_ok=False)
    return _layer_norm2d_path(path, input, weight, bias, float(eps))


# --------------------------------------------------------------------------
# The C++ ops (csrc/layer_norm.h) and their Function under transforms
# --------------------------------------------------------------------------

# (x, normalized_shape, residual, w, b, eps, center, offset, cast_x_hat, stats) -> (y, h, mean, rstd)
_forward = _C.row_norm if _C is not None else None
_ops = torch.ops.normlab


# --------------------------------------------------------------------------
# Under torch.func transforms and forward-mode AD (ops/_transforms.py): 2-D x,
# (y, mean, rstd) with (n_rows,) statistics (mean empty for RMSNorm)
# --------------------------------------------------------------------------


def _grouped(t, g: int):
    """2-D rows as (g, rows / g, n_cols): the rows of each of g grouped weights (see ``_vmap``)."""
    return t.reshape(g, -1, t.shape[-1])


def _transform_forward(x, w, b, eps, center, offset, cast_x_hat):
    y, _, mean, rstd = _forward(x, (x.shape[1],), None, w, b, eps, center, offset, cast_x_hat, True)
    return y, (mean if center else rstd.new_empty((0,))), rstd


def _transform_setup(ctx, inputs, output):
    x, w, b, eps, center, offset, cast_x_hat = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, w, mean, rstd)
    ctx.save_for_forward(x, w, mean, rstd)
    ctx.eps, ctx.center, ctx.offset, ctx.cast_x_hat = eps, center, offset, cast_x_hat
    ctx.b_dtype = b.dtype if b is not None else None
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(mean, rstd)


def _transform_backward(ctx, dy, _dmean, _drstd):
    x, w, mean, rstd = ctx.saved_tensors
    need = ctx.needs_input_grad
    need_dw = need[1] and w is not None
    need_db = need[2] and ctx.center and ctx.b_dtype is not None
    if dy is None:
        return None, None, None, None, None, None, None
    if _transforms.differentiable_backward():  # the differentiable reference backward
        shape = x.shape
        if w is not None and w.dim() == 2:  # grouped weights: rows as (G, rows per weight, n_cols)
            x, dy, w = _grouped(x, w.shape[0]), _grouped(dy, w.shape[0]), w.unsqueeze(1)
        xa = to_acc(x)
        if ctx.center:
            m, r = layer_norm_stats(xa, ctx.eps)
            dx, dw, db = layer_norm_backward_ref(dy, x, w, m, r, True, need_dw, need_db)
        else:
            r = rms_norm_stats(xa, ctx.eps)
            dx, dw = rms_norm_backward_ref(dy, x, w, r, True, need_dw, ctx.offset, ctx.cast_x_hat)
            db = None
        dx = dx.reshape(shape)
        if w is not None and w.dim() == 3:
            w = w.squeeze(1)
    elif ctx.center:
        dx, dw, db = _ops.layer_norm_bwd(dy, None, x, w, mean, rstd, (x.shape[1],), need_dw or need_db,
                                            ctx.b_dtype)
    else:
        dx, dw = _ops.rms_norm_bwd(dy, None, x, w, rstd, (x.shape[1],), ctx.offset, ctx.cast_x_hat, need_dw)
        db = None
    dw = dw.to(w.dtype) if need_dw else None
    db = db.to(ctx.b_dtype) if need_db else None
    return dx, dw, db, None, None, None, None


def _jvp(ctx, xt, wt, bt, _eps_t, _center_t, _offset_t, _cast_t):
    x, w, mean, rstd = ctx.saved_tensors
    m = mean.unsqueeze(1) if ctx.center else None
    rs = rstd.unsqueeze(1)
    p = next((t for t in (w, wt, bt) if t is not None), None)
    if p is not None and p.dim() == 2:  # grouped weights (vmap): rows as (G, rows per weight, n_cols)
        g, shape = p.shape[0], x.shape
        col = lambda t: None if t is None else t.reshape(g, -1, 1)  # noqa: E731
        row = lambda t: None if t is None else t.unsqueeze(1)  # noqa: E731
        yt = norm_jvp(_grouped(x, g), row(w), col(m), col(rs), None if xt is None else _grouped(xt, g),
                      row(wt), row(bt), ctx.center, ctx.offset, ctx.cast_x_hat)
        return (None if yt is None else yt.reshape(shape)), None, None
    yt = norm_jvp(x, w, m, rs, xt, wt, bt, ctx.center, ctx.offset, ctx.cast_x_hat)
    return yt, None, None


def _vmap(info, in_dims, x, w, b, eps, center, offset, cast_x_hat):
    """A batch of row sets is one set of more rows. Batched weights (an ensemble of models
    vmapped over stacked parameters, ``torch.func.stack_module_state``) stay in the kernel as
    *grouped* weights: the (B * n_rows, n_cols) rows with a (B, n_cols) weight and bias, row
    ``i`` taking weight row ``i // n_rows`` -- the same arithmetic as B separate calls, in one
    pass, and the backward gives the (B, n_cols) gradients. An unbatched weight or bias next to
    a batched one is expanded to (B, n_cols); a weight already grouped (nested vmap) keeps its
    order: (B, G, n_cols) becomes B * G weights over B * G row sets."""
    n = info.batch_size
    xb = _transforms.front(x, in_dims[0], n)  # (B, n_rows, n_cols)
    x2 = xb.reshape(-1, xb.shape[-1])
    grouped = any(t is not None and t.dim() == 2 for t in (w, b))  # grouped already (nested vmap)
    if in_dims[1] is not None or in_dims[2] is not None or grouped:
        flat = lambda t, d: None if t is None else _transforms.front(t, d, n).reshape(-1, t.shape[-1]).contiguous()  # noqa: E731
        w, b = flat(w, in_dims[1]), flat(b, in_dims[2])
    y, mean, rstd = _Transform.apply(x2, w, b, eps, center, offset, cast_x_hat)
    return (y.view(xb.shape), mean.view(n, -1) if center else mean.new_empty((n, 0)), rstd.view(n, -1)), (0, 0, 0)


_Transform = _register.transform(
    "RowNorm", forward=_transform_forward, setup_context=_transform_setup, backward=_transform_backward,
    jvp=_jvp, vmap=_vmap,
    doc="LayerNorm (``center``) / RMSNorm of 2-D ``x``: ``apply(x, w, b, eps, center, offset, "
        "cast_x_hat)`` -> ``(y, mean, rstd)``.",
)


def _transformed(x, res, shape, w, b, eps, center, offset, cast_x_hat):
    """``(y, h)`` under a transform: ``h = x + res`` in torch ops (as the kernel rounds it), then
    the rows of ``h`` (``x``) through :data:`_Transform`."""
    h = None if res is None else x + res
    src = x if h is None else h
    eps = rms_eps(x, eps)
    y, _, _ = _Transform.apply(rows(src, shape), flat(w), flat(b), eps, center, offset, cast_x_hat)
    y = y.reshape(x.shape)
    if not center:
        y = y.contiguous(memory_format=output_memory_format(x))
    return y, h


# --------------------------------------------------------------------------
# The entries of each path (the arguments judged by the public functions above)
# --------------------------------------------------------------------------


def _compiled(x, res, shape, w, b, eps, center, offset, cast_x_hat):
    """``(y, h)`` through ``torch.ops.normlab`` (what torch.compile traces)."""
    if eps is None:
        eps = torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps
    if res is None:
        if center:
            return _ops.layer_norm_fwd(x, w, b, shape, eps)[0], None
        return _ops.rms_norm_fwd(x, w, shape, offset, cast_x_hat, eps)[0], None
    if center:
        y, h, _, _ = _ops.add_layer_norm_fwd(x, res, w, b, shape, eps)
    else:
        y, h, _ = _ops.add_rms_norm_fwd(x, res, w, shape, offset, cast_x_hat, eps)
    return y, h


def _layer_norm_path(path, x, normalized_shape, w, b, eps):
    """LayerNorm over the trailing ``normalized_shape`` dims of ``x`` on ``path``."""
    if path == REF:
        return ref_layer_norm(x, normalized_shape, w, b, eps)
    if path == TRANSFORM:
        return _transformed(x, None, normalized_shape, w, b, eps, True, 0.0, False)[0]
    if path == COMPILE:
        return _compiled(x, None, normalized_shape, w, b, eps, True, 0.0, False)[0]
    return _forward(x, normalized_shape, None, w, b, eps, True, 0.0, False, False)[0]


def _rms_norm_path(path, x, normalized_shape, w, eps, offset=0.0, cast_x_hat=False):
    """RMSNorm over the trailing ``normalized_shape`` dims of ``x`` on ``path``; the weight applied
    as ``w + offset``, ``x_hat`` rounded to ``x``'s dtype first if ``cast_x_hat``; ``eps`` None: the
    machine epsilon of the accumulation dtype."""
    if path == REF:
        return ref_rms_norm(x, normalized_shape, w, eps, offset, cast_x_hat)
    if path == TRANSFORM:
        return _transformed(x, None, normalized_shape, w, None, eps, False, offset, cast_x_hat)[0]
    if path == COMPILE:
        return _compiled(x, None, normalized_shape, w, None, eps, False, offset, cast_x_hat)[0]
    return _forward(x, normalized_shape, None, w, None, eps, False, offset, cast_x_hat, False)[0]


def _add_layer_norm_path(path, x, residual, normalized_shape, w, b, eps):
    """``h = x + residual``, ``y = layer_norm(h)`` on ``path``; returns ``(y, h)``."""
    if path == REF:
        return ref_add_layer_norm(x, residual, normalized_shape, w, b, eps)
    if path == TRANSFORM:
        return _transformed(x, residual, normalized_shape, w, b, eps, True, 0.0, False)
    if path == COMPILE:
        return _compiled(x, residual, normalized_shape, w, b, eps, True, 0.0, False)
    return _forward(x, normalized_shape, residual, w, b, eps, True, 0.0, False, False)[:2]


def _add_rms_norm_path(path, x, residual, normalized_shape, w, eps, offset=0.0, cast_x_hat=False):
    """``h = x + residual``, ``y = rms_norm(h)`` on ``path``; returns ``(y, h)``."""
    if path == REF:
        return ref_add_rms_norm(x, residual, normalized_shape, w, eps, offset, cast_x_hat)
    if path == TRANSFORM:
        return _transformed(x, residual, normalized_shape, w, None, eps, False, offset, cast_x_hat)
    if path == COMPILE:
        return _compiled(x, residual, normalized_shape, w, None, eps, False, offset, cast_x_hat)
    return _forward(x, normalized_shape, residual, w, None, eps, False, offset, cast_x_hat, False)[:2]


def _layer_norm2d_path(path: int, x: Tensor, w: Tensor | None, b: Tensor | None, eps: float) -> Tensor:
    """LayerNorm2d over dim 1 of ``(N, C, *)`` ``x`` on ``path`` (arguments judged by
    ``normlab.functional.layer_norm2d``)."""
    if path == REF:
        return ref_layer_norm2d(x, w, b, eps)
    if path == TRANSFORM:
        return channels_as_rows(lambda *a: _layer_norm_path(TRANSFORM, *a), x, w, b, eps)
    if path == COMPILE:
        return torch.ops.normlab.layer_norm2d(x, w, b, eps)
    return _C.layer_norm2d(x, w, b, eps)
