"""Scale-only norms as functions (``normlab.functional``; the math: ``normlab.ops.scale_norm``):
timm's RmsNorm2d, SimpleNorm and SimpleNorm2d."""

from __future__ import annotations

import torch

from .._backend import COMPILE, EAGER, TRANSFORM, route
from .._checks import check_eps, check_input, check_param, normalized_shape_tuple
from ..ops import _transforms
from ..ops import extension as _extension
from ..ops.scale_norm.reference import ref_scale_norm
from .checks import check_normalized_shape
from .frn import check_4d

_C = _extension.load()


def _fast(input, weight, eps, simple):
    """The C++ entry's answer on the EAGER path (it judges the arguments as the checks do; None:
    not its case, and the checks say what)."""
    try:
        return _C.scale_norm2d_fast(input, weight, eps, simple)
    except TypeError:  # an argument of a type it does not take
        return None


def _channels(fn, input, weight, eps):
    check_input(fn, input)
    check_4d(fn, input)
    check_param(fn, "weight", weight, input, tuple(input.shape[1:2]), "num_channels, the input's dim 1")
    check_eps(fn, eps, none_ok=False)


def rms_norm2d(input: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the channel dim 1 of an ``(N, C, H, W)`` input, at every position:
    ``y[n, :, h, w] = x / sqrt(mean_C(x^2) + eps) * weight`` -- timm's ``RmsNorm2d``.

    No torch twin: ``torch.nn.functional.rms_norm`` of ``x.permute(0, 2, 3, 1)`` over ``(C,)``,
    permuted back.

    Shapes: input ``(N, C, H, W)``, output the same (in the input's memory format); ``weight``:
    ``(C,)`` or None.

    Numerics: the mean square in float32 for float16/bfloat16/float32 input and float64 for
    float64 (timm computes it in the input's dtype); the output is rounded once.

    >>> import torch, normlab.functional as NF
    >>> NF.rms_norm2d(torch.tensor([[[[3.0]], [[-4.0]]]]), eps=0.0).flatten()
    tensor([ 0.8485, -1.1314])
    """
    fn = "rms_norm2d"
    path = route(input, fn)
    if path == EAGER and (y := _fast(input, weight, eps, False)) is not None:
        return y
    _channels(fn, input, weight, eps)
    return _scale_norm(path, input, None, weight, float(eps), "rms", channels=True)


def simple_norm(input: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
                eps: float = 1e-6) -> torch.Tensor:
    """SimpleNorm over the trailing ``normalized_shape`` dims: ``y = x / sqrt(var(x) + eps) * weight``,
    with ``var`` the unbiased variance (``torch.var``'s default, as timm's ``simple_norm``) and ``x``
    not centred -- timm's ``SimpleNorm``.

    No torch twin. A row of one value has no unbiased variance: its output is NaN, as timm's.

    Shapes: input ``(*, *normalized_shape)``, output the same (contiguous); ``weight``:
    ``normalized_shape`` or None.

    Numerics: the variance by the shifted two passes in float32 for float16/bfloat16/float32 input
    and float64 for float64; the output is rounded to the input's dtype once.

    >>> import torch, normlab.functional as NF
    >>> NF.simple_norm(torch.tensor([[1.0, 3.0]]), 2, eps=0.0)
    tensor([[0.7071, 2.1213]])
    """
    fn = "simple_norm"
    path = route(input, fn)
    check_input(fn, input)
    shape = normalized_shape_tuple(fn, normalized_shape)
    check_normalized_shape(fn, input, shape)
    check_param(fn, "weight", weight, input, shape, "normalized_shape")
    check_eps(fn, eps, none_ok=False)
    return _scale_norm(path, input, shape, weight, float(eps), "simple")


def simple_norm2d(input: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """SimpleNorm over the channel dim 1 of an ``(N, C, H, W)`` input, at every position:
    ``y[n, :, h, w] = x / sqrt(var_C(x) + eps) * weight`` (unbiased variance, ``x`` not centred) --
    timm's ``SimpleNorm2d``.

    Shapes: input ``(N, C, H, W)``, output the same (in the input's memory format; timm's is the
    permuted, channels-last-strided result); ``weight``: ``(C,)`` or None.

    Numerics: as :func:`simple_norm`.

    >>> import torch, normlab.functional as NF
    >>> NF.simple_norm2d(torch.tensor([[[[1.0]], [[3.0]]]]), eps=0.0).flatten()
    tensor([0.7071, 2.1213])
    """
    fn = "simple_norm2d"
    path = route(input, fn)
    if path == EAGER and (y := _fast(input, weight, eps, True)) is not None:
        return y
    _channels(fn, input, weight, eps)
    return _scale_norm(path, input, None, weight, float(eps), "simple", channels=True)


def _scale_norm(path, x, normalized_shape, w, eps, kind, channels=False):
    """The norm of ``x`` on ``path`` (arguments judged above; see ``ops.scale_norm.reference.ref_scale_norm``).

    - ``REF``: the reference (its autograd Function with the hand-derived backward);
    - ``EAGER`` (RmsNorm2d, SimpleNorm2d): the C++ entry ``normlab._C.scale_norm2d_fast`` (the
      ``scale_norm2d_fwd`` op with its autograd node); arguments it does not take (a tensor
      subclass) go through ``torch.ops.normlab.scale_norm2d_fwd``;
    - ``COMPILE`` (the same two): ``torch.ops.normlab.scale_norm2d_fwd`` (its Meta kernel gives the shapes);
    - SimpleNorm over trailing dims has no kernel: the reference on every path;
    - ``TRANSFORM`` (torch.func transforms, forward-mode AD; on any path): the reference forward in
      plain torch ops, which torch differentiates and batches itself.
    """
    if path == TRANSFORM or _transforms.active():
        return ref_scale_norm(x, normalized_shape, w, eps, kind, channels, plain=True)
    if channels and path == EAGER:
        y = _C.scale_norm2d_fast(x, w, eps, kind == "simple")
        if y is not None:
            return y
    if channels and path in (EAGER, COMPILE):
        return torch.ops.normlab.scale_norm2d_fwd(x, w, kind == "simple", eps)[0]
    return ref_scale_norm(x, normalized_shape, w, eps, kind, channels)
