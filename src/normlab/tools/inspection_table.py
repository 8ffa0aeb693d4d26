"""The table of an :class:`~normlab.tools.inspection.InspectReport` (as its ``to_dict()``): rich
renderables for a terminal, plain text that fits a width."""

from __future__ import annotations

import io

__all__ = ["render", "renderables", "output_width"]


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


LEGEND = ("legend: C = num_features / num_channels; G = num_groups; shape = normalized_shape; "
          "mom = momentum; tracks = track_running_stats=True; nbt = num_batches_tracked; "
          "var a..b = smallest..largest running_var; initial 0/1 = running statistics never updated "
          "(mean 0, var 1); var≈0, var>1e6, var<0 = channels with such a running variance; "
          "×N after a name = the layer is called N times. sample 0 vs others: does sample 0's output change "
          "when the rest of its batch changes; batch 1 vs N: does it change when it is alone; "
          "changes (d) = yes, by up to d; same = no; fails = the layer raises; - = does not apply.")
COLUMNS = ("layer", "class", "mode", "input", "statistics over", "parameters", "sample 0 vs others", "batch 1 vs N",
           "running statistics")


def _cells(row: dict) -> list[str]:
    from rich.markup import escape
    calls = f" ×{row['calls']}" if row["calls"] > 1 else ""
    return [escape(row["name"] + calls), row["cls"], row["mode"], escape(str(row["input_shape"] or "-")),
            escape(row["axes_text"]), _params_text(row["params"]), _yes_no(row, "others"),
            _yes_no(row, "batch_size"), _running_text(row["running"])]


class _Layers:
    """The layers as one table where it fits the width it is printed in, else as one block
    per layer (name and class first, then a line per measurement): no word is cut."""

    def __init__(self, d: dict) -> None:
        self.d = d

    def _table(self):
        from rich.markup import escape
        from rich.table import Table
        d = self.d
        table = Table(title=f"{d['model']} ({d['model_mode']} mode) on input {escape(d['input_shape'])}: "
                            f"{len(d['layers'])} norm layer{'s' if len(d['layers']) != 1 else ''}",
                      title_justify="left")
        for col in COLUMNS:
            table.add_column(col, no_wrap=True)
        for row in d["layers"]:
            table.add_row(*_cells(row))
        return table

    def _blocks(self):
        from rich.markup import escape
        from rich.table import Table
        from rich.text import Text
        d = self.d
        n = len(d["layers"])
        yield Text(f"{d['model']} ({d['model_mode']} mode) on input {d['input_shape']}: "
                   f"{n} norm layer{'s' if n != 1 else ''}", style="italic")
        for row in d["layers"]:
            cells = _cells(row)
            yield Text.from_markup(f"[bold]{cells[0]}[/]  {escape(row['cls'])}, {row['mode']} mode, input {cells[3]}")
            grid = Table.grid(padding=(0, 2))
            grid.add_column(no_wrap=True)
            grid.add_column(overflow="fold")
            for label, value in zip(COLUMNS[4:], cells[4:]):
                grid.add_row("  " + label, value)
            yield grid

    def __rich_console__(self, console, options):
        from rich.measure import Measurement
        table = self._table()
        wide = options.update(max_width=10_000)            # the table's natural width, unclamped
        if Measurement.get(console, wide, table).maximum <= options.max_width:
            yield table
        else:
            yield from self._blocks()


def renderables(d: dict):
    """The report's layers (a table, or blocks when narrow), notes, warnings and the legend,
    as one rich renderable."""
    from rich.console import Group
    from rich.markup import escape
    from rich.text import Text

    parts = [_Layers(d)]
    notes = [f"{row['name']}: {row['measure_note']}" for row in d["layers"] if row["measure_note"]]
    if notes:
        parts.append(Text("notes: " + "; ".join(notes)))
    for w in d["warnings"]:
        parts.append(Text.from_markup(f"[yellow]warning[/] {escape(w['layer'])}: {escape(w['problem'])}\n"
                                      f"    [green]fix:[/] {escape(w['fix'])}"))
    if not d["warnings"]:
        parts.append(Text("no pitfalls found"))
    parts.append(Text(LEGEND, style="dim"))
    return Group(*parts)


def output_width() -> int | None:
    """The width to print in: the terminal's (None: rich asks it), else $COLUMNS, else 80."""
    import shutil
    import sys
    if sys.stdout.isatty():
        return None
    return shutil.get_terminal_size((80, 24)).columns


def render(result: dict, width: int | None = None) -> str:
    """The report as text that fits ``width`` columns (default :func:`output_width`: the
    terminal's, or $COLUMNS, or 80 for a pipe or a file); colour only on a terminal."""
    import sys

    from rich.console import Console

    buf = io.StringIO()
    tty = sys.stdout.isatty()
    Console(file=buf, width=width or output_width(), force_terminal=tty and width is None,
            soft_wrap=False).print(renderables(result))
    return "\n".join(line.rstrip() for line in buf.getvalue().rstrip("\n").splitlines())
