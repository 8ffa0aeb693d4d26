"""Filter Response Normalization as a function (``normlab.functional``; the math: ``normlab.ops.frn``),
and the check the (N, C, H, W) layers of timm's norms share.

``filter_response_norm`` judges the arguments and runs the path ``normlab._backend.route`` decided:

- ``REF``: the reference, ``ops.frn.reference.ref_frn`` (its autograd Function with the
  hand-derived backward);
- ``EAGER``: the C++ entry ``normlab._C.frn_fast`` (the ``frn_fwd`` op with its autograd node,
  without the dispatcher's Python layer); arguments it does not take (a tensor subclass) go through
  ``torch.ops.normlab.frn_fwd``;
- ``COMPILE``: ``torch.ops.normlab.frn_fwd`` (traced as one node; its Meta kernel gives the shapes);
- ``TRANSFORM`` (torch.func transforms, forward-mode AD; on any path): the reference forward in
  plain torch ops, which torch differentiates and batches itself.
"""

from __future__ import annotations

import torch

from .._backend import COMPILE, EAGER, TRANSFORM, route
from .._checks import check_eps, check_input, check_param
from ..ops import _transforms
from ..ops import extension as _extension
from ..ops.frn.reference import ref_frn

_C = _extension.load()


def check_4d(fn: str, x: torch.Tensor) -> None:
    """``x`` is (N, C, H, W): ``ValueError`` otherwise, torch's class for a 2-D layer given
    another rank (``BatchNorm2d``: "expected 4D input")."""
    if x.dim() != 4:
        raise ValueError(f"{fn}: expected a 4-D input (N, C, H, W), got input of shape {list(x.shape)}; "
                         f"add the missing dims, e.g. x[..., None, None] for (N, C)")


def filter_response_norm(
    input: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    tau: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """Filter Response Normalization (Singh and Krishnan, CVPR 2020), with its TLU when ``tau`` is
    given: ``z = x / sqrt(mean_HW(x^2) + eps) * weight + bias``, ``y = max(z, tau)`` -- timm's
    ``FilterResponseNormTlu2d`` (``FilterResponseNormAct2d``: ``tau`` None, an activation after).

    No torch twin. Each (sample, channel) is divided by the root mean square of its H * W values
    (not centred); ``weight``, ``bias`` and ``tau`` are per channel.

    Shapes: input ``(N, C, H, W)``, output the same (in the input's memory format);
    ``weight``, ``bias``, ``tau``: ``(C,)`` or None.

    Numerics: the mean square and the output in float32 for float16/bfloat16/float32 input and
    float64 for float64; the output is rounded to the input's dtype once. At a tie ``z == tau`` the
    gradient is split in halves between ``z`` and ``tau``, as ``torch.maximum`` splits it.

    >>> import torch, normlab.functional as NF
    >>> NF.filter_response_norm(torch.tensor([[[[3.0, -4.0]]]]), tau=torch.zeros(1))
    tensor([[[[0.8485, 0.0000]]]])
    """
    fn = "filter_response_norm"
    path = route(input, fn)
    if path == EAGER:  # the C++ entry judges the arguments as the checks below; None: not its case
        try:
            y = _C.frn_fast(input, weight, bias, tau, eps)
        except TypeError:  # an argument of a type it does not take: the checks below say what
            y = None
        if y is not None:
            return y
    check_input(fn, input)
    check_4d(fn, input)
    shape = tuple(input.shape[1:2])
    for name, p in (("weight", weight), ("bias", bias), ("tau", tau)):
        check_param(fn, name, p, input, shape, "num_features, the input's dim 1")
    check_eps(fn, eps, none_ok=False)
    eps = float(eps)
    if path == TRANSFORM or _transforms.active():
        return ref_frn(input, weight, bias, tau, eps, plain=True)
    if path == EAGER:
        y = _C.frn_fast(input, weight, bias, tau, eps)
        if y is not None:
            return y
    if path == EAGER or path == COMPILE:
        return torch.ops.normlab.frn_fwd(input, weight, bias, tau, eps)[0]
    return ref_frn(input, weight, bias, tau, eps)
