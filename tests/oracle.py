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


def assert_within_rounding(
    got: torch.Tensor, ref: torch.Tensor, factor: float = 2.0, what: str = "", dtype: torch.dtype | None = None
) -> None:
    """``got`` is within ``factor`` x the error of rounding the float64 ``ref`` to ``dtype``
    (``got``'s own dtype unless given)."""
    dtype = got.dtype if dtype is None else dtype
    bound = factor * rounding_err(ref, dtype)
    err = rel_err(got, ref)
    assert err <= bound, f"{what}: relative error {err:.3e} > {factor} x rounding error to {dtype} ({bound:.3e})"


def graph_nodes(t: torch.Tensor) -> list[str]:
    """Class names of every autograd node that ``t`` was computed through."""
    seen, stack, names = set(), [t.grad_fn], []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(type(node).__name__)
        stack.extend(n for n, _ in node.next_functions)
    return names


def forbid_ops(monkeypatch, *ops: str) -> None:
    """Replace every backend's function of ``ops`` in the backend table with one that fails the
    test when it is called (a bad argument must be caught before any op runs)."""
    from normlab import _backend

    def boom(*args, **kwargs):  # pragma: no cover - must not be reached
        raise AssertionError("op called with bad arguments")

    for key in list(_backend._IMPL):
        if key[0] in ops:
            monkeypatch.setitem(_backend._IMPL, key, boom)
    monkeypatch.setattr(_backend, "_AUTO", {})
