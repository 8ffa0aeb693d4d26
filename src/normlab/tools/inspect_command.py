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

import io

import torch
from torch import nn

from .inspection import inspect

__all__ = ["add_arguments", "run", "render", "renderables"]


# --- the table ---------------------------------------------------------------------------


def _yes_no(d: dict, key: str) -> str:
    changed, diff = d[f"{key}_changed"], d[f"{key}_diff"]
    if changed is None:
        return "-"
    if diff is None:
        return "[red]fails[/]"
    return f"[red]changes[/] ({diff:.2g})" if changed else "same"


def _params_text(p: dict) -> str:
    size = p.get("num_features", p.get("normalized_shape", p.get("num_channels")))
    bits = [f"shape={size}" if "normalized_shape" in p else f"C={size}"]
    if "num_groups" in p:
        bits.append(f"G={p['num_groups']}")
    bits.append(f"eps={p['eps']:g}")
    if "momentum" in p:
        bits.append(f"mom={p['momentum']}")
        bits.append("tracks" if p["track_running_stats"] else "[yellow]no running stats[/]")
    bits.append("affine" if p["affine"] else "no affine")
    return " ".join(bits)


def _running_text(r: dict | None) -> str:
    if r is None:
        return "-"
    bad = []
    if r["nan_inf"]:
        bad.append(f"[red]{r['nan_inf']} NaN/Inf[/]")
    if r["negative_var"]:
        bad.append(f"[red]{r['negative_var']} var<0[/]")
    if r["near_zero_var"]:
        bad.append(f"[yellow]{r['near_zero_var']} var≈0[/]")
    if r["huge_var"]:
        bad.append(f"[yellow]{r['huge_var']} var>1e6[/]")
    if r["initial"]:
        bad.append("[yellow]initial 0/1[/]")
    span = f"var {r['min_var']:.3g}..{r['max_var']:.3g}" if r["min_var"] is not None else ""
    nbt = f" nbt={r['num_batches_tracked']}" if r["num_batches_tracked"] is not None else ""
    return ", ".join(bad or ["ok"]) + f" {span}{nbt}"


def renderables(d: dict):
    """The report's table, notes and warnings, as one rich renderable."""
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"{d['model']} ({d['model_mode']} mode) on input {escape(d['input_shape'])}: "
                        f"{len(d['layers'])} norm layer(s)", title_justify="left")
    for col in ("layer", "class", "mode", "input", "statistics over", "parameters",
                "sample 0 vs others", "batch 1 vs N", "running statistics"):
        table.add_column(col, overflow="fold")
    for row in d["layers"]:
        calls = f" ×{row['calls']}" if row["calls"] > 1 else ""
        table.add_row(escape(row["name"] + calls), row["cls"], row["mode"], escape(str(row["input_shape"] or "-")),
                      escape(row["axes_text"]),
                      _params_text(row["params"]), _yes_no(row, "others"), _yes_no(row, "batch_size"),
                      _running_text(row["running"]))
    parts = [table]
    notes = [f"{row['name']}: {row['measure_note']}" for row in d["layers"] if row["measure_note"]]
    if notes:
        parts.append(Text("notes: " + "; ".join(notes)))
    for w in d["warnings"]:
        parts.append(Text.from_markup(f"[yellow]warning[/] {escape(w['layer'])}: {escape(w['problem'])}\n"
                                      f"    [green]fix:[/] {escape(w['fix'])}"))
    if not d["warnings"]:
        parts.append(Text("no pitfalls found"))
    return Group(*parts)


def render(result: dict) -> str:
    """The report as text (the rich table, no colour codes unless stdout is a terminal)."""
    import sys

    from rich.console import Console

    buf = io.StringIO()
    tty = sys.stdout.isatty()
    Console(file=buf, width=None if tty else 180, force_terminal=tty).print(renderables(result))
    return "\n".join(line.rstrip() for line in buf.getvalue().rstrip("\n").splitlines())


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
            spec = importlib.util.spec_from_file_location(os.path.basename(module_name)[:-3], module_name)
            if spec is None or not os.path.exists(module_name):
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
