"""``normlab inspect MODULE:FACTORY --input-shape 8,3,32,32``: the table of
:func:`normlab.inspect` for a model built by a factory function.

    normlab inspect my_models:build --input-shape 8,3,32,32 --eval
    normlab inspect path/to/models.py:build --input-shape 4,16 --json

``MODULE`` is a dotted module name (found from the current directory too) or a ``.py``
file; ``FACTORY`` a function in it that returns the model when called with no
arguments (or a Module instance). The example input is ``torch.randn`` of the given
shape. A freshly built model is in training mode: ``--eval`` calls ``model.eval()`` first.
"""

from __future__ import annotations

import torch
from torch import nn

from .inspection import inspect
from .inspection_table import render

__all__ = ["add_arguments", "run", "render"]


# --- the command: normlab inspect MODULE:FACTORY --input-shape 8,3,32,32 -----------------


def add_arguments(parser) -> None:
    parser.add_argument("target", metavar="MODULE:FACTORY",
                        help="where the model comes from: a module (dotted name, or a .py file) and a function "
                             "in it that returns the model, called with no arguments (or a Module instance)")
    parser.add_argument("--input-shape", required=True, metavar="N,C,...",
                        help="shape of the random example input, e.g. 8,3,32,32")
    parser.add_argument("--eval", dest="eval_mode", action="store_true",
                        help="call model.eval() first (a freshly built model is in training mode)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random example input (default 0)")


def _load(target: str) -> nn.Module:
    import importlib
    import importlib.util
    import os
    import sys

    module_name, sep, attr = target.rpartition(":")
    if not sep or not module_name or not attr:
        raise SystemExit(f"normlab inspect: expected MODULE:FACTORY (e.g. my_models:build or "
                         f"path/to/models.py:build), got {target!r}")
    try:
        if module_name.endswith(".py"):
            if not os.path.isfile(module_name):
                what = "is a folder, not a file" if os.path.isdir(module_name) else "does not exist"
                raise SystemExit(f"normlab inspect: {module_name!r} {what} (full path "
                                 f"{os.path.abspath(module_name)}); give the path of a .py file, absolute or "
                                 f"relative to the current directory, or a dotted module name (e.g. my_models:build)")
            spec = importlib.util.spec_from_file_location(os.path.basename(module_name)[:-3], module_name)
            if spec is None:
                raise FileNotFoundError(module_name)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path:  # like `python -m`: modules in the current directory
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except (ImportError, FileNotFoundError) as e:
        raise SystemExit(f"normlab inspect: cannot import {module_name!r}: {e}") from e
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise SystemExit(f"normlab inspect: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    model = obj if isinstance(obj, nn.Module) else obj()
    if not isinstance(model, nn.Module):
        raise SystemExit(f"normlab inspect: {target} returned {type(model).__name__}, expected a torch.nn.Module")
    return model


def _shape(text: str) -> list[int]:
    try:
        shape = [int(s) for s in text.split(",")]
    except ValueError:
        shape = []
    if not shape or any(d < 1 for d in shape):
        raise SystemExit(f"normlab inspect: expected --input-shape as positive ints separated by commas "
                         f"(e.g. 8,3,32,32), got {text!r}")
    return shape


def run(target: str, input_shape: str, eval_mode: bool = False, seed: int = 0) -> dict:
    shape = _shape(input_shape)
    model = _load(target)
    if eval_mode:
        model.eval()
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    try:
        report = inspect(model, x, show=False)
    except ValueError as e:
        raise SystemExit(f"normlab {e}") from e
    return report.to_dict()
