"""What the normalization modules share: affine parameters and running statistics."""

from __future__ import annotations

import numbers

import torch
from torch import nn

from .. import _checks
from .._checks import normalized_shape_tuple

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# Constructor checks: run before anything is allocated, with the class torch raises for the
# same mistake (TypeError for a wrong type, RuntimeError for a negative size, ValueError for
# a value out of range) and "expected ..., got ...".


def check_size(cls: str, name: str, value, what: str) -> int:
    """``value`` is an int >= 0 (``what``: what it counts); returns it as an int."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"{cls}: expected {name} to be an int ({what}), got {value!r}")
    if value < 0:
        raise RuntimeError(f"{cls}: expected {name} >= 0 ({what}), got {value}")
    return int(value)


def check_shape(cls: str, normalized_shape) -> tuple[int, ...]:
    """``normalized_shape``: an int or a non-empty sequence of ints >= 0; returns it as a tuple."""
    shape = normalized_shape_tuple(cls, normalized_shape)  # TypeError unless int(s)
    if len(shape) == 0:
        raise RuntimeError(
            f"{cls}: expected normalized_shape to have at least one dim, got {normalized_shape!r}; "
            f"pass the size of the last dim, e.g. {cls}(512) for inputs of shape (*, 512)"
        )
    if any(d < 0 for d in shape):
        raise RuntimeError(f"{cls}: expected normalized_shape of sizes >= 0, got {normalized_shape!r}")
    return shape


def check_eps(cls: str, eps, none_ok: bool = False) -> None:
    """``eps`` is a number >= 0 (``inf`` included, as torch), or None where ``none_ok``: the one
    judgement ``normlab.functional`` makes too (:func:`normlab._checks.check_eps`)."""
    _checks.check_eps(cls, eps, none_ok)


def check_momentum(cls: str, momentum) -> None:
    """``momentum`` is None or a number in [0, 1] (the weight of the new batch statistic): the
    judgement of ``normlab.functional`` (:func:`normlab._checks.check_momentum`), with None."""
    _checks.check_momentum(cls, momentum, none_ok=True)


def check_dtype(cls: str, dtype) -> None:
    """``dtype`` is None or a floating-point dtype normlab computes in."""
    if dtype is None:
        return
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"{cls}: expected dtype to be a torch.dtype or None, got {dtype!r}")
    if dtype not in _FLOAT_DTYPES:
        raise RuntimeError(
            f"{cls}: expected a floating-point dtype (torch.float16, torch.bfloat16, torch.float32 or "
            f"torch.float64), got {dtype}"
        )


def register_affine(module: nn.Module, shape, affine: bool, bias: bool, factory_kwargs: dict) -> None:
    """Register ``weight`` (gamma) and ``bias`` (beta) of ``shape``, or None where absent.

    ``bias=False`` registers ``bias`` as None: a layer asked for no bias never has one.
    Values are set by the module's ``reset_parameters``.
    """
    if affine:
        module.weight = nn.Parameter(torch.empty(shape, **factory_kwargs))
        if bias:
            module.bias = nn.Parameter(torch.empty(shape, **factory_kwargs))
        else:
            module.register_parameter("bias", None)
    else:
        module.register_parameter("weight", None)
        module.register_parameter("bias", None)


def reset_affine(module: nn.Module) -> None:
    """gamma (``weight``) to ones, beta (``bias``) to zeros: the identity affine."""
    if module.weight is not None:
        nn.init.ones_(module.weight)
    if module.bias is not None:
        nn.init.zeros_(module.bias)


class _NotScriptable:
    """torch.jit.script's hook (``__prepare_scriptable__``, called on every submodule before
    scripting): normlab's layers are Python with a C++ fast path, not TorchScript, so scripting
    one stops here with what to do instead rather than deep inside TorchScript's compiler."""

    def __prepare_scriptable__(self):
        name = f"normlab.nn.{type(self).__name__}"
        raise RuntimeError(
            f"{name} cannot be compiled by torch.jit.script (TorchScript, deprecated in PyTorch); "
            "script a copy with torch.nn's layers instead -- torch.jit.script(normlab.revert("
            "copy.deepcopy(model))), the same parameters and outputs -- or use torch.jit.trace, "
            "torch.export or torch.compile, which take normlab's layers as they are")


class _NormBase(_NotScriptable, nn.Module):
    """Per-channel affine parameters and running statistics (BatchNorm, InstanceNorm).

    State, with torch's names:

    - ``weight`` (gamma, ones) and ``bias`` (beta, zeros), shape ``(C,)``, when
      ``affine``; ``bias=False`` registers ``bias`` as None.
    - ``running_mean`` (zeros), ``running_var`` (ones) and ``num_batches_tracked``
      (a long scalar, 0) when ``track_running_stats``; None otherwise.

    ``state_dict`` version 2 added ``num_batches_tracked``; loading an older
    checkpoint keeps the module's count.
    """

    _version = 2
    __constants__ = ["track_running_stats", "momentum", "eps", "num_features", "affine"]

    def __init__(
        self,
        num_features: int,
        eps: float,
        momentum: float | None,
        affine: bool,
        track_running_stats: bool,
        device=None,
        dtype=None,
        *,
        bias: bool = True,
    ) -> None:
        cls = type(self).__name__
        num_features = check_size(cls, "num_features", num_features, "the number of channels C")
        check_eps(cls, eps)
        check_momentum(cls, momentum)
        check_dtype(cls, dtype)
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        register_affine(self, num_features, affine, bias, factory_kwargs)
        if track_running_stats:
            self.register_buffer("running_mean", torch.zeros(num_features, **factory_kwargs))
            self.register_buffer("running_var", torch.ones(num_features, **factory_kwargs))
            # a count, never a float: it keeps only the device of factory_kwargs
            self.register_buffer(
                "num_batches_tracked", torch.tensor(0, dtype=torch.long, device=device)
            )
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def _momentum_factor(self, count):
        """The weight of this batch's statistic in the running ones: ``momentum``, or with
        ``momentum=None`` and a batch count ``count`` (``num_batches_tracked``; None when
        nothing is tracked) the cumulative average's ``1 / (count + 1)`` -- this batch is
        number ``count + 1``. Inside ``torch.compile`` that is a tensor, read when the update
        runs (a float would break the graph on the buffer's value)."""
        if self.momentum is not None:
            return self.momentum
        if count is None:
            return 0.0  # unused: nothing is updated
        if torch.compiler.is_compiling():
            return 1.0 / (count + 1).to(torch.float64)
        return 1.0 / float(count + 1)

    def _check_num_channels(self, input: torch.Tensor) -> None:
        """``input`` has ``num_features`` channels in dim 1."""
        if input.shape[1] != self.num_features:
            raise RuntimeError(
                f"{type(self).__name__}: expected input with {self.num_features} channels "
                f"(num_features) in dim 1, got input of shape {list(input.shape)} with "
                f"{input.shape[1]} channels"
            )

    def reset_running_stats(self) -> None:
        """``running_mean`` to 0, ``running_var`` to 1, ``num_batches_tracked`` to 0."""
        if self.track_running_stats:
            self.running_mean.zero_()
            self.running_var.fill_(1)
            self.num_batches_tracked.zero_()

    def reset_parameters(self) -> None:
        """Reset the running statistics, then gamma to ones and beta to zeros."""
        self.reset_running_stats()
        reset_affine(self)

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
            f"affine={self.affine}, bias={self.bias is not None}, "
            f"track_running_stats={self.track_running_stats}"
        )

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ) -> None:
        version = local_metadata.get("version", None)
        if (version is None or version < 2) and self.track_running_stats:
            # Checkpoints before version 2 have no num_batches_tracked: keep ours (or 0).
            key = prefix + "num_batches_tracked"
            if key not in state_dict:
                nbt = self.num_batches_tracked
                state_dict[key] = (
                    nbt
                    if nbt is not None and nbt.device != torch.device("meta")
                    else torch.tensor(0, dtype=torch.long)
                )
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )


def timm_layout(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``x`` in ``channels_last`` memory format where ``m.channels_last_output`` is set (a 4-D
    ``x``; the copy timm's permute-based forward makes too), so that ``m``'s output is laid out
    as timm's; otherwise ``x``."""
    if m.channels_last_output and x.dim() == 4 and not x.is_contiguous(memory_format=torch.channels_last):
        return x.contiguous(memory_format=torch.channels_last)
    return x
