"""The ``normlab`` command line: a thin shell over functions the tests also call.

Every command is a module with ``run(**options) -> dict`` and
``render(result) -> str`` (optionally ``add_arguments(parser)`` for its own
options). The command prints ``render(run(...))``, or ``json.dumps(run(...))``
with ``--json``. No math here.

Adding a command is one line in ``COMMANDS``: ``"bench": Leaf("normlab.bench", "...")``,
or one line in a ``Group`` (``normlab demo TOPIC``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import NamedTuple, Sequence, Union

from ._extras import missing
from ._version import __version__


class Leaf(NamedTuple):
    """A command that runs one module (or ``"module:name"``, an object of it): ``run``,
    ``render``, optional ``add_arguments``."""

    module: str
    help: str


class Group(NamedTuple):
    """A command with topics: ``normlab NAME TOPIC``."""

    help: str
    topics: dict[str, Leaf]


COMMANDS: dict[str, Union[Leaf, Group]] = {
    "demo": Group("recompute a source chapter's script with normlab beside torch.nn", {
        "layernorm": Leaf("normlab.demos.layernorm", "LayerNorm chapter: layernorm_manual.py"),
        "batchnorm": Leaf("normlab.demos.batchnorm", "BatchNorm chapter: batchnorm_train_eval.py"),
        "shapes": Leaf("normlab.demos.shapes", "LayerNorm(512) on a [32, 10, 512] tensor: shapes, batch size 1"),
    }),
    "compare": Leaf("normlab.demos.compare", "BatchNorm1d vs LayerNorm table, every cell measured live"),
    "bench": Leaf("normlab.bench", "time normlab against torch eager, torch.compile and the memory-copy limit"),
    "inspect": Leaf("normlab.tools.inspect_command", "table of a model's norm layers: statistics axes, measured batch dependence, running-stats health, pitfalls with fixes"),
    "experiment": Group("the chapters' experiments over many seeds, stored in SQLite (resumable)", {
        "stability": Leaf("normlab.experiments.stability",
                          "the chapter's MLP at lr 0.1..4 with no norm, BatchNorm, LayerNorm, RMSNorm, GroupNorm"),
        "batch-size": Leaf("normlab.experiments.batch_size",
                           "a small CNN on digits at batch sizes 2..128: BatchNorm vs GroupNorm (Wu & He, Figure 1)"),
        "train-eval": Leaf("normlab.experiments.train_eval",
                           "forgetting model.eval(): BatchNorm vs LayerNorm evaluated in train mode at batch 1, 2, 8, all"),
        "ddp": Leaf("normlab.experiments.ddp", "SyncBatchNorm vs per-rank BatchNorm vs one process, DistributedDataParallel on CPU (gloo)"),
    }),
    "report": Leaf("normlab.experiments.report", "the stored experiment runs as Markdown + HTML with plots, and a CSV"),
    "figures": Leaf("normlab.figures", "the documentation's five pictures, each from a live computation, as PNGs in --out"),
    "docs": Group("the documentation site, from a checkout of normlab (MkDocs; needs the docs extra)", {
        "build": Leaf("normlab.docs_site:build", "build the site with mkdocs build --strict into site/"),
        "serve": Leaf("normlab.docs_site:serve", "serve the site locally, rebuilt on changes"),
    }),
}


def _add_leaf(subparsers, name: str, leaf: Leaf) -> None:
    # allow_abbrev=False everywhere: `--lr 2` must not start a study as `--lrs 2`
    p = subparsers.add_parser(name, help=leaf.help, description=leaf.help, allow_abbrev=False)
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of a report")
    path, _, attr = leaf.module.partition(":")
    module = importlib.import_module(path)
    if attr:
        module = getattr(module, attr)
    if hasattr(module, "add_arguments"):
        module.add_arguments(p)
    p.set_defaults(_module=module, _parser=p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="normlab", description="normlab: normalization layers for PyTorch, checked against torch.nn.",
        allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"normlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, entry in COMMANDS.items():
        if isinstance(entry, Group):
            group = sub.add_parser(name, help=entry.help, description=entry.help, allow_abbrev=False)
            topics = group.add_subparsers(dest="topic", metavar="TOPIC", required=True)
            for topic, leaf in entry.topics.items():
                _add_leaf(topics, topic, leaf)
        else:
            _add_leaf(sub, name, entry)
    return parser


#: The exit status after Ctrl-C (128 + SIGINT), for every command.
INTERRUPTED = 130


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 on success, 2 after a bad option, 130
    after Ctrl-C)."""
    parser = build_parser()
    namespace, unknown = parser.parse_known_args(argv)
    args = vars(namespace)
    name = " ".join(filter(None, (args.get("command"), args.get("topic"))))
    if unknown:  # the subcommand's own usage, not the top-level one
        args.get("_parser", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    args.pop("_parser")
    module = args.pop("_module")
    as_json = args.pop("json")
    args.pop("command")
    args.pop("topic", None)
    try:
        result = module.run(**args)
        sys.stdout.write((json.dumps(result) if as_json else module.render(result)) + "\n")
    except ValueError as e:  # a command's own check of its options: the message, not a traceback
        if not str(e).startswith("normlab"):
            raise
        sys.stderr.write(f"{e}\n")
        return 2
    except ImportError as e:  # an optional package this command needs: one line naming the extra
        message = missing(e, f"normlab {name}")
        if message is None:
            raise
        sys.stderr.write(f"{message}\n")
        return 1
    except KeyboardInterrupt:  # Ctrl-C where a command does not catch it itself: one line, 130
        sys.stderr.write(f"normlab {name}: interrupted (Ctrl-C)\n")
        return INTERRUPTED
    # a command that stopped at Ctrl-C and kept its work says so in its result: 130 as well,
    # as a shell reports an interrupted command (and as the experiments exit)
    return INTERRUPTED if isinstance(result, dict) and result.get("interrupted") else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
