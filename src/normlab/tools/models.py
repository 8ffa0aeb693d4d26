"""A model as the tools take it: the argument check, its example inputs, its state put back
exactly after a run, and its module hooks carried over or cleared."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

# Every dict of hooks a torch Module keeps (what a replacement must carry, what a private copy clears)
_HOOK_DICTS = (
    "_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
    "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
    "_backward_pre_hooks", "_state_dict_hooks", "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks",
)


def check_model(fn: str, model) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"{fn}: expected model to be a torch.nn.Module, got {type(model).__name__}")


def copy_hooks(src: nn.Module, dst: nn.Module) -> None:
    """``src``'s module hooks on ``dst`` (copies of the dicts: later hooks on one stay off the other)."""
    for hooks in _HOOK_DICTS:
        if hasattr(src, hooks) and hasattr(dst, hooks):
            setattr(dst, hooks, getattr(src, hooks).copy())


def clear_hooks(m: nn.Module) -> None:
    """Remove every module hook of ``m`` (a private copy, on which the user's hooks must not fire)."""
    for hooks in _HOOK_DICTS:
        if hasattr(m, hooks):
            getattr(m, hooks).clear()


def as_args(example_input) -> tuple:
    """A model's positional inputs: a tuple/list is several, anything else is one."""
    return tuple(example_input) if isinstance(example_input, (tuple, list)) else (example_input,)


def shapes(args: tuple) -> str:
    return ", ".join(str(list(a.shape)) if isinstance(a, torch.Tensor) else type(a).__name__ for a in args)


@contextlib.contextmanager
def preserved_state(model: nn.Module) -> Iterator[None]:
    """Run ``model`` freely inside; on the way out every module's train/eval flag and every
    buffer (values and the tensor objects themselves) are as they were."""
    flags = [(m, m.training) for m in model.modules()]
    saved = []
    for m in model.modules():
        for name, buf in m._buffers.items():
            if buf is not None:
                saved.append((m, name, buf, buf.detach().clone()))
    try:
        yield
    finally:
        with torch.no_grad():
            for m, name, buf, copy in saved:
                buf.copy_(copy)
                m._buffers[name] = buf
        for m, flag in flags:
            m.training = flag
