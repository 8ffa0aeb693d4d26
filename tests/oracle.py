"""Independent oracles shared by the tests: float64 references and error measures."""

from __future__ import annotations

import torch


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative error in the Frobenius norm, computed in float64."""
    got, ref = got.double(), ref.double()
    return ((got - ref).norm() / ref.norm()).item()


def rounding_err(ref: torch.Tensor, dtype: torch.dtype) -> float:
    """The error of rounding a float64 result to ``dtype``: the best any kernel can do."""
    return rel_err(ref.to(dtype), ref)


def assert_within_rounding(got: torch.Tensor, ref: torch.Tensor, factor: float = 2.0, what: str = "") -> None:
    """``got`` is within ``factor`` x the error of rounding the float64 ``ref`` to ``got``'s dtype."""
    bound = factor * rounding_err(ref, got.dtype)
    err = rel_err(got, ref)
    assert err <= bound, f"{what}: relative error {err:.3e} > {factor} x rounding error ({bound:.3e})"
