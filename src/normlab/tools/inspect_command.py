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

import math

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
    except SyntaxError as e:
        raise SystemExit(f"normlab inspect: {e.filename or module_name} line {e.lineno} has a syntax error "
                         f"({e.msg}); fix the file and run again") from None
    except (ImportError, FileNotFoundError) as e:
        raise SystemExit(f"normlab inspect: cannot import {module_name!r}: {e}") from e
    except Exception as e:  # noqa: BLE001 - the module's own code failed while importing
        raise SystemExit(f"normlab inspect: importing {module_name!r} raised {_where(e)}; fix the module "
                         "and run again") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise SystemExit(f"normlab inspect: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    model = obj if isinstance(obj, nn.Module) else _build(target, obj)
    if not isinstance(model, nn.Module):
        raise SystemExit(f"normlab inspect: {target} returned {type(model).__name__}, expected a torch.nn.Module")
    return model


def _where(e: BaseException) -> str:
    """``KeyError: 'x' (models.py line 7)``: the error and the last line of the user's own code
    it came through (not torch's, not normlab's, not the import machinery's)."""
    import os
    import traceback

    skip = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)), "<")
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith(skip)]
    where = f" ({os.path.basename(frames[-1].filename)} line {frames[-1].lineno})" if frames else ""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}{': ' + lines[0] if lines else ''}{where}"


def _build(target: str, factory) -> object:
    """Call the factory with no arguments; one that needs some is told how to wrap it."""
    import inspect as pyinspect

    if not callable(factory):
        raise SystemExit(f"normlab inspect: {target} is a {type(factory).__name__}, expected a function that "
                         "returns the model (or a Module instance)")
    try:
        params = pyinspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: just call it
        params = []
    needed = [p.name for p in params if p.default is p.empty
              and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    module_name, _, attr = target.rpartition(":")
    call = attr if module_name.endswith(".py") else f"{module_name}.{attr}"
    if needed:
        raise SystemExit(f"normlab inspect: {target} needs arguments ({', '.join(needed)}); give a function that "
                         f"builds the model with none, e.g. in models.py: def build(): return {call}(...), then: "
                         "normlab inspect models.py:build")
    try:
        return factory()
    except Exception as e:  # noqa: BLE001 - the factory's own code failed
        raise SystemExit(f"normlab inspect: {target}() raised {_where(e)}; fix the factory and run again") from None


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


def _size(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000


def _shape(text: str) -> list[int]:
    try:
        shape = [int(s) for s in text.split(",")]
    except ValueError:
        shape = []
    if not shape or any(d < 1 for d in shape):
        raise SystemExit(f"normlab inspect: expected --input-shape as positive ints separated by commas "
                         f"(e.g. 8,3,32,32), got {text!r}")
    need, have = 4 * math.prod(shape), _available_bytes()
    if have is not None and need > have // 2:  # the model's activations need room beside the input
        raise SystemExit(f"normlab inspect: --input-shape {text} is {_size(need)} of float32, more than half the "
                         f"{_size(have)} of memory available; give a small example of the shape the model takes")
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
