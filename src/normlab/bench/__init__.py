"""``normlab bench``: normlab against torch eager, ``torch.compile`` and the copy limit.

For each op, shape, dtype, thread count and mode (forward, backward,
forward+backward), the providers (``normlab-cpu``, ``normlab-ref``, ``torch``,
``compile``, ``limit``) run in one process on the same tensors, interleaved,
after warm-up; the median of the repeats is reported with the achieved GB/s
(minimal bytes / time), the speed-up over torch eager and over ``torch.compile``
and the fraction of the copy limit. What each op must move at least, and why,
is the table in :mod:`normlab.bench.cases`.

Files in ``--out`` (default ``bench-results/``): ``bench.csv`` and
``bench.json`` (rewritten after every finished group, so Ctrl-C keeps what was
measured) and ``gbps_<dtype>_t<threads>.png``. ``--resume`` skips groups whose
rows are already there (n/a rows count as there).

    normlab bench --quick                      # < 1 min: one shape per op, float32, 1 thread
    normlab bench --ops layer_norm,add_rms_norm --dtypes bfloat16 --threads 2
    normlab bench --sizes 4x6,4096x1024 --providers torch,normlab-ref,limit
    python -m normlab.bench --quick            # the same without the top-level CLI
    normlab bench --suite chapters --quick     # module calls at the chapters' sizes (normlab.bench.chapters)
    normlab bench --suite sweep --quick        # module calls on seeded random shapes (normlab.bench.sweep)
    normlab bench --suite memory --quick       # peak and held memory, a process per call (normlab.bench.memory)

From Python (what the CLI and the tests call)::

    from normlab.bench import run_bench
    result = run_bench(ops=["layer_norm"], sizes=["4x6"], out="/tmp/b", repeats=3)

Timings on a shared or busy machine are noisy: compare providers within one
group (they saw the same load), not across runs.
"""

from __future__ import annotations

from .cases import MODES, OPS, PROVIDERS
from .run_context import DEFAULT_OUT
from .report import make_table, render_table
from .runner import run_bench

__all__ = ["run_bench", "add_arguments", "add_bench_parser", "main_bench", "run", "render",
           "OPS", "MODES", "PROVIDERS"]

#: ``--suite``: "default" is this module's op benchmark; "chapters" is :mod:`normlab.bench.chapters`;
#: "blocks" is :mod:`normlab.bench.blocks`; "sweep" :mod:`normlab.bench.sweep`; "memory" :mod:`normlab.bench.memory`
SUITES = ("default", "chapters", "blocks", "sweep", "memory")

# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

HELP = "time normlab against torch eager, torch.compile and the memory-copy limit"


def add_arguments(parser) -> None:
    """The options of ``normlab bench`` (the ``normlab.cli`` convention)."""
    parser.add_argument("--suite", default="default", choices=SUITES,
                        help="default: ops against torch eager, torch.compile and the copy limit; "
                             "chapters: normlab.nn module calls against torch.nn's at the chapters' "
                             "sizes, and the chapter's training loop (normlab.bench.chapters); "
                             "blocks: a Llama decoder block with and without normlab.convert, and "
                             "LayerNorm2d vs permute+LayerNorm (normlab.bench.blocks); sweep: normlab.nn vs "
                             "torch.nn on seeded random shapes (normlab.bench.sweep); memory: peak and held "
                             "memory of one call, a fresh process each (normlab.bench.memory)")
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                        help=f"directory for bench.csv, bench.json and the PNGs; chapters.csv, chapters.json with "
                             f"--suite chapters (default {DEFAULT_OUT}/)")
    parser.add_argument("--quick", action="store_true",
                        help="under a minute: one shape per op family, float32, 1 thread, few repeats")
    parser.add_argument("--resume", action="store_true",
                        help="keep the rows in --out and skip groups already measured")
    parser.add_argument("--ops", metavar="LIST", help=f"comma-separated, from {', '.join(OPS)}, batch_norm "
                        "(--suite chapters: layer names such as batchnorm1d,layernorm,add_rms_norm,loop)")
    parser.add_argument("--modes", metavar="LIST", help=f"comma-separated, from {', '.join(MODES)} "
                        "(--suite chapters: fwd, fwd+bwd, eval fwd)")
    parser.add_argument("--dtypes", metavar="LIST", help="comma-separated, from float32, bfloat16")
    parser.add_argument("--threads", metavar="LIST", help="comma-separated thread counts (default 1,2)")
    parser.add_argument("--providers", metavar="LIST", help=f"comma-separated, from {', '.join(PROVIDERS)}")
    parser.add_argument("--sizes", metavar="LIST",
                        help="comma-separated shapes replacing the defaults, e.g. 4x6,4096x1024,32x64x32x32 "
                             "(2-D: every op but layer_norm2d; 3-D and up: batch_norm/group_norm/layer_norm2d)")
    parser.add_argument("--repeats", type=int, metavar="N", help="timed repeats per group (default 11; quick 5)")
    parser.add_argument("--warmup", type=int, metavar="N", help="warm-up samples per provider (default 2; quick 1)")
    parser.add_argument("--compile-backend", default="inductor", metavar="NAME",
                        help="torch.compile backend of the 'compile' provider (default inductor)")
    parser.add_argument("--cells", type=int, metavar="N", help="--suite sweep: cells to draw (default 300; quick 24)")
    parser.add_argument("--seed", type=int, metavar="N", help="--suite sweep: seed of the draw (default 0)")
    parser.add_argument("--max-mb", type=float, metavar="MB", help="--suite sweep: largest input in MiB (default 64)")
    parser.add_argument("--worst", type=int, metavar="N", help="--suite sweep: cells in the worst-cell table (default 15)")
    parser.add_argument("--rerun-worst", type=int, metavar="K",
                        help="--suite sweep: measure the K slowest cells in --out again, 3x the repeats")
    parser.add_argument("--large", action="store_true",
                        help="--suite memory: add a (1, 8, 4096, 4096) image and a 3-D volume (GBs of memory)")


_OPTION_NAMES = ("suite", "out", "quick", "resume", "ops", "modes", "dtypes", "threads", "providers",
                 "sizes", "repeats", "warmup", "compile_backend")


# --suite sweep / memory: their own options, and the shared ones each takes
_SUITE_OPTION_NAMES = ("cells", "seed", "max_mb", "worst", "rerun_worst", "large")
_SUITE_OPTIONS = {"sweep": ("out", "quick", "resume", "ops", "modes", "dtypes", "threads", "repeats", "warmup",
                            "cells", "seed", "max_mb", "worst", "rerun_worst"),
                  "memory": ("out", "quick", "resume", "ops", "modes", "dtypes", "threads", "large")}


def _run_sweep_or_memory(options: dict, suite: str) -> dict:
    given = {k: v for k, v in options.items() if v is not None and v is not False and k != "compile_backend"}
    for name in given:
        if name not in _SUITE_OPTIONS[suite]:
            raise ValueError(f"normlab bench --suite {suite}: --{name.replace('_', '-')} is not used by this suite "
                             f"(it takes {', '.join('--' + o.replace('_', '-') for o in _SUITE_OPTIONS[suite])})")
    if suite == "memory":
        from .memory import run_memory
        return run_memory(**given)
    from .sweep import run_sweep
    if "worst" in given:
        given["worst_n"] = given.pop("worst")
    return run_sweep(**given)


# --suite chapters: the options it takes (--ops names its layers); the rest must be unset
_CHAPTERS_OPTIONS = ("out", "quick", "resume", "modes", "dtypes", "threads", "repeats", "warmup")


def _run_chapters(options: dict, suite: str = "chapters") -> dict:
    from .blocks import run_blocks
    from .chapters import run_chapters

    for name in ("sizes", "providers"):
        if options.get(name) is not None:
            raise ValueError(f"normlab bench --suite {suite}: --{name} is not used by this suite "
                             "(its shapes and providers are fixed: torch.nn vs normlab.nn)")
    opts = {k: options[k] for k in _CHAPTERS_OPTIONS if options.get(k) is not None}
    return (run_blocks if suite == "blocks" else run_chapters)(layers=options.get("ops"), **opts)


def run(**options) -> dict:
    """``normlab.cli`` convention: run with the parsed options, return the result dict."""
    suite = options.pop("suite", None) or "default"
    if suite not in SUITES:
        raise ValueError(f"normlab bench: unknown suite {suite!r}; expected one of {list(SUITES)}")
    for name in _SUITE_OPTION_NAMES if suite not in ("sweep", "memory") else ():
        if options.get(name) not in (None, False):
            raise ValueError(f"normlab bench: --{name.replace('_', '-')} belongs to --suite "
                             f"{'memory' if name == 'large' else 'sweep'}, got --suite {suite}")
    if suite in ("sweep", "memory"):
        return _run_sweep_or_memory(options, suite)
    if suite in ("chapters", "blocks"):
        return _run_chapters(options, suite)
    return run_bench(**{k: v for k, v in options.items() if k in _OPTION_NAMES})


def _footer(result: dict) -> list[str]:
    files = result["files"]
    lines = [f"warning: {w}" for w in result.get("warnings", [])]
    lines.append(f"files: {', '.join([files['csv'], files['json'], *files['png']])}")
    if result["interrupted"]:
        lines.append("interrupted: the files hold every group finished before Ctrl-C; "
                     "continue with --resume")
    return lines


def render(result: dict) -> str:
    """``normlab.cli`` convention: the result as text (table, then the files written)."""
    if result.get("suite") in ("sweep", "memory"):
        from importlib import import_module
        return import_module(f".{result['suite']}", __name__).render(result)
    if result.get("suite") == "blocks":
        from .blocks import render as render_blocks
        return render_blocks(result)
    if result.get("suite") == "chapters":
        from .chapters import render as render_chapters
        return render_chapters(result)
    return "\n".join([render_table(result["rows"]), *_footer(result)])


def add_bench_parser(subparsers):
    """Add ``bench`` to an argparse ``subparsers``; ``args.func(args)`` runs it."""
    p = subparsers.add_parser("bench", help=HELP, description=HELP)
    add_arguments(p)
    p.set_defaults(func=main_bench)
    return p


def main_bench(args) -> int:
    """Run ``normlab bench`` from parsed ``args``; prints the table; returns the exit status
    (2 after a bad option, with its one-line message on stderr as ``normlab bench`` prints it;
    130 after Ctrl-C, as a shell reports an interrupted command)."""
    import sys

    from rich.console import Console

    try:
        result = run(**{k: getattr(args, k) for k in _OPTION_NAMES + _SUITE_OPTION_NAMES if hasattr(args, k)})
    except ValueError as e:
        if not str(e).startswith("normlab"):
            raise
        sys.stderr.write(f"{e}\n")
        return 2
    if result.get("suite") in ("chapters", "blocks", "sweep", "memory"):
        from importlib import import_module
        import_module(f".{result['suite']}", __name__).print_result(result)
        return 130 if result["interrupted"] else 0
    console = Console()
    if not console.is_terminal:  # a file or pipe: do not squeeze the table into 80 columns
        console = Console(width=180)
    console.print(make_table(result["rows"]))
    for line in _footer(result):
        console.print(line, highlight=False)
    return 130 if result["interrupted"] else 0
