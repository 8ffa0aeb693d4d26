"""LayerNorm and RMSNorm modules: drop-ins for ``torch.nn.LayerNorm`` / ``torch.nn.RMSNorm``."""

from __future__ import annotations

import numbers

import torch
from torch import nn

from .. import functional as F
from .._checks import rms_variant
from ._base import _NotScriptable, check_dtype, check_eps, check_shape, register_affine, reset_affine, timm_layout


class LayerNorm(_NotScriptable, nn.Module):
    """Layer normalization over the trailing ``normalized_shape`` dims:
    ``y = (x - mean) / sqrt(var + eps) * weight + bias``.

    Twin: ``torch.nn.LayerNorm`` -- same arguments, defaults, parameters and ``state_dict``
    keys. Differences: ``normalized_shape=()`` is refused at construction (torch fails at the
    first forward), and float32 rows with a large mean keep their accuracy (a shifted
    two-pass algorithm).

    Shapes: input ``(*, *normalized_shape)``, output the same; ``weight``, ``bias``:
    ``normalized_shape`` (``elementwise_affine=False``: neither; ``bias=False``: no bias).

    Numerics: mean and biased variance of each sample alone (no batch statistics, no running
    statistics; train and eval are the same, batch size 1 works), accumulated in float32 for
    float16/bfloat16/float32 input and float64 for float64; the output is cast to the input's
    dtype once.

    >>> import torch, normlab
    >>> ln = normlab.nn.LayerNorm(3)
    >>> ln(torch.tensor([[1.0, 2.0, 3.0], [10.0, 20.0, 30.0]]))
    tensor([[-1.2247,  0.0000,  1.2247],
            [-1.2247,  0.0000,  1.2247]], grad_fn=<...>)
    """

    __constants__ = ["normalized_shape", "eps", "elementwise_affine"]

    def __init__(
        self,
        normalized_shape,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        normalized_shape = check_shape("LayerNorm", normalized_shape)
        check_eps("LayerNorm", eps)
        check_dtype("LayerNorm", dtype)
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__()
        self.normalized_shape = normalized_shape
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        register_affine(self, self.normalized_shape, elementwise_affine, bias, factory_kwargs)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """gamma (``weight``) to ones, beta (``bias``) to zeros: the identity affine."""
        reset_affine(self)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, "
            f"elementwise_affine={self.elementwise_affine}, bias={self.bias is not None}"
        )


class RMSNorm(_NotScriptable, nn.Module):
    """Root-mean-square normalization over the trailing ``normalized_shape`` dims:
    ``y = x / sqrt(mean(x^2) + eps) * weight``.

    Twin: ``torch.nn.RMSNorm`` -- same arguments, defaults, parameters and ``state_dict`` keys;
    no centring, no bias. ``eps=None`` uses ``torch.finfo`` of the accumulation dtype
    (``torch.finfo(torch.float32).eps`` for float16/bfloat16/float32 input), as torch.

    Two keyword-only options give the RMSNorm of models that define their own
    (``normlab.convert`` sets them when it swaps such a module):

    - ``casting``: where the result is rounded to the input's dtype. ``"torch"``
      (default): once, at the end. ``"llama"``: ``weight * x_hat.to(dtype)`` --
      Llama, Mistral, Qwen2/3, Phi-3, T5. ``"gemma"``: ``(x_hat * weight.float()).to(dtype)``,
      the weight taken in float32 whatever its dtype.
    - ``offset``: the weight is applied as ``weight + offset`` and initialised to
      ``1 - offset`` (Gemma: ``offset=1.0``, a zero-initialised weight).

    Shapes: input ``(*, *normalized_shape)``, output the same; ``weight``: ``normalized_shape``.

    Numerics: ``mean(x^2)`` of each sample, accumulated in float32 for float16/bfloat16/float32
    input and float64 for float64; the output is cast once (``casting="torch"``).

    >>> import torch, normlab
    >>> normlab.nn.RMSNorm(2)(torch.tensor([[3.0, 4.0]]))  # rms = sqrt((9 + 16) / 2)
    tensor([[0.8485, 1.1314]], grad_fn=<...>)
    >>> gemma = normlab.nn.RMSNorm(8, eps=1e-6, casting="gemma", offset=1.0)
    >>> bool((gemma.weight == 0).all())
    True
    """

    __constants__ = ["normalized_shape", "eps", "elementwise_affine", "casting", "offset"]

    def __init__(
        self,
        normalized_shape,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device=None,
        dtype=None,
        *,
        casting: str = "torch",
        offset: float = 0.0,
    ) -> None:
        normalized_shape = check_shape("RMSNorm", normalized_shape)
        check_eps("RMSNorm", eps, none_ok=True)
        check_dtype("RMSNorm", dtype)
        _, offset = rms_variant("RMSNorm", casting, offset, True)  # checks both
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__()
        self.normalized_shape = normalized_shape
        if not elementwise_affine and offset != 0.0:
            raise ValueError(
                f"RMSNorm: offset={offset!r} shifts the weight, but elementwise_affine=False gives no "
                f"weight; pass elementwise_affine=True or leave offset at 0.0"
            )
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.casting = casting
        self.offset = offset
        register_affine(self, self.normalized_shape, elementwise_affine, False, factory_kwargs)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``weight`` to ``1 - offset`` (ones by default): the applied weight ``weight + offset`` is 1."""
        if self.offset == 0.0:
            reset_affine(self)
        elif self.weight is not None:
            with torch.no_grad():
                self.weight.fill_(1.0 - self.offset)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.casting == "torch" and self.offset == 0.0:  # torch.nn.RMSNorm's own call
            return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps, casting=self.casting,
                          offset=self.offset)

    def extra_repr(self) -> str:
        s = f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        if self.casting != "torch":
            s += f", casting={self.casting!r}"
        if self.offset != 0.0:
            s += f", offset={self.offset}"
        return s


class LayerNorm2d(_NotScriptable, nn.Module):
    """LayerNorm over the channels of an ``(N, C, H, W)`` input, at every pixel:
    ``y[n, :, h, w] = (x[n, :, h, w] - mean) / sqrt(var + eps) * weight + bias``.

    No torch.nn twin: it is the channels-first LayerNorm of ConvNeXt, SAM, detectron2 and timm,
    with their parameters and ``state_dict`` keys (``weight``, ``bias``, shape ``(C,)``) and
    their default ``eps=1e-6``; ``normalized_shape`` and ``elementwise_affine`` are there too,
    as on timm's (a ``torch.nn.LayerNorm`` subclass). It equals
    ``torch.nn.LayerNorm(C)`` applied to ``x.permute(0, 2, 3, 1)``, permuted back.

    Shapes: input ``(N, C, H, W)``, output the same, in the input's memory format (a
    ``channels_last`` input runs on LayerNorm's row kernel without a copy). With
    ``channels_last_output = True`` (an attribute, set on the twins ``normlab.convert`` makes of
    timm's permute-based ``LayerNorm2d``/``LayerNormAct2d``) the output is ``channels_last`` whatever
    the input's format, as timm's is: the layers after it then run the kernels they ran before
    (a 1x1 convolution on a contiguous bfloat16 tensor is several times slower on CPU).

    Numerics: mean and biased variance over the ``C`` values of one pixel, accumulated in
    float32 for float16/bfloat16/float32 input and float64 for float64; output cast once.

    >>> import torch, normlab
    >>> ln = normlab.nn.LayerNorm2d(8)
    >>> x = torch.randn(2, 8, 5, 5).contiguous(memory_format=torch.channels_last)
    >>> ln(x).is_contiguous(memory_format=torch.channels_last)
    True
    """

    __constants__ = ["num_channels", "eps", "affine"]
    channels_last_output = False

    def __init__(self, num_channels: int, eps: float = 1e-6, affine: bool = True, device=None, dtype=None) -> None:
        if not isinstance(num_channels, numbers.Integral) or isinstance(num_channels, bool):
            raise TypeError(f"LayerNorm2d: expected num_channels to be an int (the number of channels C), "
                            f"got {num_channels!r}")
        if num_channels < 1:
            raise ValueError(f"LayerNorm2d: expected num_channels to be a positive int, got {num_channels!r}")
        num_channels = int(num_channels)
        check_eps("LayerNorm2d", eps)
        check_dtype("LayerNorm2d", dtype)
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__()
        self.num_channels = num_channels
        self.normalized_shape = (num_channels,)
        self.eps = eps
        self.affine = affine
        self.elementwise_affine = affine
        register_affine(self, self.normalized_shape, affine, True, factory_kwargs)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``weight`` to ones, ``bias`` to zeros."""
        reset_affine(self)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.dim() != 4:
            raise ValueError(f"LayerNorm2d: expected 4D input (N, C, H, W) (got {input.dim()}D input)")
        if input.shape[1] != self.num_channels:
            raise RuntimeError(
                f"LayerNorm2d: expected input with {self.num_channels} channels (num_channels) in dim 1, "
                f"got input of shape {list(input.shape)}; a channels-last (N, H, W, C) tensor is "
                f"x.permute(0, 3, 1, 2) here"
            )
        return F.layer_norm2d(timm_layout(self, input), self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        s = f"{self.num_channels}, eps={self.eps}, affine={self.affine}"
        return s + (", channels_last_output=True" if self.channels_last_output else "")
