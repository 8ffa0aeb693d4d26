"""``normlab bench --suite memory``: the memory of one normlab.nn call beside torch.nn's on the same call.

Each case (a module, an input shape and layout, a dtype, a mode) runs in a **fresh Python
process per provider**, the two side by side (``normlab``: the normlab.nn module; ``torch``: the
torch.nn module built with the same arguments; LayerNorm2d's torch side is permute + LayerNorm +
permute), so that nothing one call grew or cached is seen by the next. In that process:

1. ``torch.set_num_threads(threads)``; the module is built; one *warm-up* call of the same
   module, dtype, layout and mode on a tiny input (at most 4 rows, 2 samples, 4 per spatial
   dim) loads the code, starts the thread pool and does any first-call initialisation;
2. the input ``x`` (and ``dy`` for a backward) is drawn in place in its dtype and layout
   (``torch.empty(...).normal_()``: no float32 temporary), ``gc.collect()``;
3. *before*: the resident set size (``/proc/self/statm``) and the bytes malloc has in use;
4. the peak is reset: writing ``5`` to ``/proc/self/clear_refs`` sets the kernel's high-water
   mark ``VmHWM`` to the current RSS (Linux >= 4.0; exact, page-granular, no sampling);
5. the call: ``y = m(x)`` (``eval fwd``: under ``torch.no_grad()``), and for ``*fwd+bwd``
   ``y.backward(dy)`` with ``x`` requiring grad; the outputs (``y``, ``x.grad``, the
   parameters' ``.grad``) are kept;
6. **peak** = ``VmHWM`` − RSS before: what the call needed above its inputs, outputs included;
7. the outputs and gradients are dropped (``y`` deleted, every ``.grad = None``), ``gc.collect()``;
8. **held** = RSS after − RSS before (what the process still holds, as ``top`` sees it), and
   **malloc held** = malloc's bytes in use after − before. torch's CPU allocator is glibc
   malloc, so malloc's count sees every tensor and every ``std::vector`` of every thread
   (``malloc_info``: all arenas and mmap'd chunks, 64-bit counts; ``mallinfo2`` covers the
   main arena only and ``tracemalloc`` sees no C++). RSS also sees memory freed to malloc but
   not returned to the system.

Why not the alternatives: ``ru_maxrss`` cannot be reset (a process's earlier peak hides the
call's); a sampling thread misses short peaks and needs the GIL. Where ``clear_refs`` cannot
be written, a 0.2 ms sampling thread and ``ru_maxrss`` stand in (``method`` in the rows says
which). :func:`calibrate` checks the method itself: a toy call that keeps 100 MB must show
peak ≈ 100 and held ≈ 100, one that frees them peak ≈ 100 and held ≈ 0 (its line is printed
with the table). MB = 2^20 bytes.

Targets (issue 32): normlab's peak <= torch's + 16 MB and held (both counts) <= torch's + 32 MB;
``verdict`` says ``ok`` or what is over.

    normlab bench --suite memory --quick            # 12 cases, float32 (one bfloat16): ~1.5 min
    normlab bench --suite memory                    # 88 cases: every family, layout, mode; float32, bfloat16
    normlab bench --suite memory --quick --large    # plus a (1, 8, 4096, 4096) image, a 3-D volume: ~3 GB
    normlab bench --suite memory --ops batch_norm --modes "fwd,eval fwd+bwd" --dtypes bfloat16

Files in ``--out``: ``memory.csv``, ``memory.json`` (after every case; ``--resume`` skips
cases there). From Python: ``run_memory(quick=True)``, ``measure_in_subprocess(spec)``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import json
import os
import subprocess
import sys
import threading

from .chapters_data import choose, read_rows, row_key, write_csv
from .report import write_json
from .run_context import DEFAULT_OUT, check_count, listify, make_out, progress_bar, run_meta
from .sweep import DTYPES, FAMILIES, FAMILY_MODES, MODES, SweepCase

SUITE = "memory"
CSV_NAME, JSON_NAME = "memory.csv", "memory.json"
PROVIDERS = ("torch", "normlab")
PEAK_TOLERANCE_MB, HELD_TOLERANCE_MB = 16, 32
MB = 2**20
_TAG = "normlab-memory-result: "
_CHILD = "from normlab.bench.memory import child_main; child_main()"
FIELDS = ("layer", "family", "shape", "layout", "dtype", "threads", "mode", "large", "status", "verdict",
          *[f"{p}_{k}" for p in PROVIDERS for k in ("peak_mb", "held_mb", "malloc_held_mb")],
          "method", "reason")
KEY_FIELDS = ("layer", "shape", "layout", "dtype", "threads", "mode")


@dataclasses.dataclass(frozen=True)
class MemCase:
    case: SweepCase
    dtype: str
    mode: str
    large: bool = False

    def spec(self, provider: str, threads: int) -> dict:
        return {"kind": "module", "provider": provider, "case": self.case.spec(), "dtype": self.dtype,
                "mode": self.mode, "threads": threads}

    def key(self, threads: int) -> tuple:
        c = self.case
        return (c.label, c.shape_str, c.layout, self.dtype, str(threads), self.mode)


def _c(family, name, args, shape, layout="contiguous", kwargs=()):
    return SweepCase(name, tuple(args), tuple(shape), tuple(kwargs), layout, family)


# one case per family and layout, 16-32 MB of float32 each (channels_last where it exists too)
_BASE = (
    _c("layer_norm", "LayerNorm", (4096,), (2048, 4096)),
    _c("rms_norm", "RMSNorm", (4096,), (2048, 4096)),
    _c("batch_norm", "BatchNorm1d", (512,), (16384, 512)),
    *[_c("batch_norm", "BatchNorm2d", (64,), (8, 64, 128, 128), lay) for lay in ("contiguous", "channels_last")],
    _c("batch_norm", "BatchNorm2d", (3,), (32, 3, 256, 256)),
    _c("batch_norm", "BatchNorm2d", (8,), (1, 8, 1024, 1024)),
    *[_c("batch_norm", "BatchNorm3d", (16,), (2, 16, 32, 64, 64), lay) for lay in ("contiguous", "channels_last")],
    *[_c("group_norm", "GroupNorm", (32, 128), (16, 128, 64, 64), lay) for lay in ("contiguous", "channels_last")],
    *[_c("instance_norm", "InstanceNorm2d", (64,), (8, 64, 128, 128), lay, (("affine", True),))
      for lay in ("contiguous", "channels_last")],
    *[_c("layer_norm2d", "LayerNorm2d", (64,), (8, 64, 128, 128), lay) for lay in ("contiguous", "channels_last")],
)
_BY_LABEL = {(c.label, c.shape_str, c.layout): c for c in _BASE}
_QUICK = (  # (label, shape, layout, dtype, mode)
    ("LayerNorm(4096)", "2048x4096", "contiguous", "float32", "fwd+bwd"),
    ("RMSNorm(4096)", "2048x4096", "contiguous", "float32", "fwd+bwd"),
    ("BatchNorm1d(512)", "16384x512", "contiguous", "float32", "fwd+bwd"),
    ("BatchNorm2d(64)", "8x64x128x128", "contiguous", "float32", "fwd"),
    ("BatchNorm2d(64)", "8x64x128x128", "contiguous", "float32", "eval fwd+bwd"),
    ("BatchNorm2d(64)", "8x64x128x128", "channels_last", "float32", "fwd+bwd"),
    ("BatchNorm2d(3)", "32x3x256x256", "contiguous", "bfloat16", "fwd"),
    ("BatchNorm2d(8)", "1x8x1024x1024", "contiguous", "float32", "fwd+bwd"),
    ("BatchNorm3d(16)", "2x16x32x64x64", "contiguous", "float32", "fwd+bwd"),
    ("GroupNorm(32, 128)", "16x128x64x64", "channels_last", "float32", "fwd+bwd"),
    ("InstanceNorm2d(64, affine=True)", "8x64x128x128", "contiguous", "float32", "fwd+bwd"),
    ("LayerNorm2d(64)", "8x64x128x128", "channels_last", "float32", "fwd+bwd"),
)
# --large: a large image at batch 1 and a 3-D volume (512 MB and 256 MB of float32 input)
_IMG, _VOL = (_c("batch_norm", "BatchNorm2d", (8,), (1, 8, 4096, 4096)),
              _c("batch_norm", "BatchNorm3d", (4,), (1, 4, 64, 512, 512)))
_LARGE = ((_IMG, "float32", "fwd"), (_IMG, "float32", "fwd+bwd"), (_IMG, "float32", "eval fwd+bwd"),
          (_IMG, "bfloat16", "fwd"), (_VOL, "float32", "fwd+bwd"),
          (_c("group_norm", "GroupNorm", (4, 8), (1, 8, 4096, 4096)), "float32", "fwd+bwd"))


def memory_cases(quick: bool = False, large: bool = False, families=FAMILIES, dtypes=("float32", "bfloat16"),
                 modes=MODES) -> list[MemCase]:
    """The suite's cases: ``quick`` the 12 of ``_QUICK``, else every base case in every dtype and
    mode of its family; ``large`` adds the large image and volume; then filtered."""
    if quick:
        cases = [MemCase(_BY_LABEL[(lab, shp, lay)], dt, mode) for lab, shp, lay, dt, mode in _QUICK]
    else:
        cases = [MemCase(c, dt, m) for c in _BASE for dt in ("float32", "bfloat16") for m in FAMILY_MODES[c.family]
                 if not (m == "eval fwd" and c.family != "batch_norm")]  # no_grad fwd: as fwd, less
    cases += [MemCase(c, dt, m, True) for c, dt, m in _LARGE] if large else []
    return [mc for mc in cases if mc.case.family in families and mc.dtype in dtypes and mc.mode in modes]


# --------------------------------------------------------------------------
# The measurement (in the child process)
# --------------------------------------------------------------------------

def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak() -> bool:
    """Set the kernel's peak RSS (VmHWM) to the current RSS; False where that is not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


def malloc_in_use() -> int | None:
    """Bytes glibc malloc has handed out and not had back, all arenas and mmap'd chunks
    (``malloc_info``'s totals: system − free + mmap); None without glibc."""
    import xml.etree.ElementTree as ET
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.open_memstream.restype = ctypes.c_void_p
        libc.open_memstream.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
        libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.fclose.argtypes = libc.free.argtypes = [ctypes.c_void_p]
    except (OSError, AttributeError):
        return None
    buf, size = ctypes.c_void_p(), ctypes.c_size_t()
    fp = libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
    libc.malloc_info(0, fp)
    libc.fclose(fp)
    text = ctypes.string_at(buf, size.value).decode()
    libc.free(buf)
    root = ET.fromstring(text)
    total = {e.get("type"): int(e.get("size")) for e in root.findall("total")}
    system = {e.get("type"): int(e.get("size")) for e in root.findall("system")}
    return system["current"] - total.get("fast", 0) - total.get("rest", 0) + total.get("mmap", 0)


class _Sampler(threading.Thread):
    """The fallback peak: RSS sampled every 0.2 ms (and ``ru_maxrss`` at the end)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak, self.done = rss_bytes(), threading.Event()

    def run(self):
        while not self.done.wait(0.0002):
            self.peak = max(self.peak, rss_bytes())

    def stop(self) -> int:
        import resource
        self.done.set()
        self.join()
        return max(self.peak, rss_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def _module_call(spec: dict):
    """``(call(x, dy) -> outputs, release(x, outputs), x, dy, warm-up)`` of a module case."""
    import torch
    from .sweep import build_pair, make_input

    case, dt, mode = SweepCase.from_spec(spec["case"]), DTYPES[spec["dtype"]], spec["mode"]
    m = build_pair(case, dt, torch.Generator().manual_seed(0))[spec["provider"]]
    m.train(not mode.startswith("eval"))
    backward, params = mode.endswith("fwd+bwd"), tuple(m.parameters())

    def call(x, dy):
        if not backward:
            with torch.no_grad() if mode == "eval fwd" else torch.enable_grad():
                return [m(x)]
        x.requires_grad_(True)
        y = m(x)
        y.backward(dy)
        return [y, x.grad, *(p.grad for p in params)]

    def release(x, outs):
        outs.clear()
        for t in (x, *params):
            t.grad = None

    def inputs(shape):
        return make_input(shape, dt, case.layout), (make_input(shape, dt, case.layout) if backward else None)

    small = (min(case.shape[0], 4), case.shape[1], *(min(s, 4) for s in case.shape[2:]))
    if len(case.shape) > 2:
        small = (min(case.shape[0], 2), *small[1:])

    def warm():
        xs, dys = inputs(small)
        release(xs, call(xs, dys))
    return call, release, inputs(case.shape), warm


def _toy_call(spec: dict):
    """A stand-in call for :func:`calibrate`: it allocates ``mb`` MB and returns them
    (``freed``: dropped with the outputs) or also keeps them (``held``)."""
    import torch
    kept = []

    def call(x, dy):
        t = torch.ones(int(spec["mb"] * MB) // 4)
        if spec["toy"] == "held":
            kept.append(t)
        return [t]
    return call, (lambda x, outs: outs.clear()), (torch.zeros(1), None), (lambda: None)


def measure(spec: dict) -> dict:
    """Measure one call in this process (see the module docstring); sizes in MB."""
    import torch
    torch.set_num_threads(int(spec.get("threads", 1)))
    call, release, (x, dy), warm = (_toy_call if spec["kind"] == "toy" else _module_call)(spec)
    warm()
    gc.collect()
    rss0, malloc0 = rss_bytes(), malloc_in_use()
    exact = reset_peak()
    sampler = None if exact else _Sampler()
    if sampler:
        sampler.start()
    outs = call(x, dy)
    peak = peak_bytes() if exact else sampler.stop()
    release(x, outs)
    del outs
    gc.collect()
    rss1, malloc1 = rss_bytes(), malloc_in_use()
    return {"peak_mb": (peak - rss0) / MB, "held_mb": (rss1 - rss0) / MB,
            "malloc_held_mb": None if malloc0 is None else (malloc1 - malloc0) / MB,
            "method": "VmHWM after clear_refs" if exact else "sampled RSS + ru_maxrss"}


def child_main() -> None:
    """The child process: ``sys.argv[1]`` is the JSON spec; prints the result on a tagged line."""
    print(_TAG + json.dumps(measure(json.loads(sys.argv[1]))), flush=True)


def start_child(spec: dict) -> subprocess.Popen:
    """A fresh interpreter running :func:`measure` on ``spec`` (read it with :func:`child_result`)."""
    return subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def child_result(p: subprocess.Popen, timeout: float = 600.0) -> dict:
    """The child's result: ``{"status": "ok", peak_mb, held_mb, malloc_held_mb, method}`` or
    ``{"status": "error", "reason"}``."""
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        return {"status": "error", "reason": f"no result within {timeout:.0f} s"}
    for line in stdout.splitlines():
        if line.startswith(_TAG):
            return {"status": "ok", **json.loads(line[len(_TAG):])}
    tail = (stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
    return {"status": "error", "reason": tail[:300]}


def measure_in_subprocess(spec: dict, timeout: float = 600.0) -> dict:
    """:func:`measure` in a fresh interpreter (see :func:`child_result`)."""
    return child_result(start_child(spec), timeout)


def calibrate(mb: float = 100.0) -> dict:
    """``{"mb": mb, "held": result, "freed": result}``: the toy calls measured as any case is."""
    children = {toy: start_child({"kind": "toy", "toy": toy, "mb": mb}) for toy in ("held", "freed")}
    return {"mb": mb, **{toy: child_result(p) for toy, p in children.items()}}


# --------------------------------------------------------------------------
# The run and its report
# --------------------------------------------------------------------------

def verdict(row: dict) -> str:
    """``ok`` when normlab is within the targets of torch on every count, else what is over."""
    if row["status"] != "ok":
        return ""
    over = []
    for what, tol in (("peak", PEAK_TOLERANCE_MB), ("held", HELD_TOLERANCE_MB), ("malloc_held", HELD_TOLERANCE_MB)):
        n, t = row.get(f"normlab_{what}_mb"), row.get(f"torch_{what}_mb")
        if n is not None and t is not None and n > t + tol:
            over.append(f"{what.replace('_', ' ')} +{n - t:.0f} MB")
    return "ok" if not over else "over: " + ", ".join(over)


def memory_row(mc: MemCase, threads: int, results: dict) -> dict:
    c = mc.case
    row = {"layer": c.label, "family": c.family, "shape": c.shape_str, "layout": c.layout, "dtype": mc.dtype,
           "threads": threads, "mode": mc.mode, "large": mc.large}
    bad = [(p, r) for p, r in results.items() if r["status"] != "ok"]
    row.update(status="error" if bad else "ok", reason="; ".join(f"{p}: {r['reason']}" for p, r in bad),
               method=next((r["method"] for r in results.values() if r.get("method")), ""))
    for p, r in results.items():
        row.update({f"{p}_{k}": r.get(k) for k in ("peak_mb", "held_mb", "malloc_held_mb")})
    row["verdict"] = verdict(row)
    return row


def run_memory(quick: bool = False, large: bool = False, ops=None, modes=None, dtypes=None, threads=None,
               out: str = DEFAULT_OUT, resume: bool = False, progress: bool = True, timeout: float = 600.0,
               calibrate_mb: float | None = 100.0) -> dict:
    """Measure every case (a fresh process per case and provider), rewriting ``memory.csv``/
    ``.json`` after each. ``calibrate_mb``: first run :func:`calibrate` with that size (None:
    skip). Returns ``suite``, ``rows``, ``files``, ``calibration``, ``measured``, ``skipped``,
    ``interrupted``, ``summary``."""
    fams = choose(ops, FAMILIES, "family", {"row": ("layer_norm", "rms_norm")}, SUITE) or list(FAMILIES)
    mode_list = choose(modes, MODES, "mode", None, SUITE) or list(MODES)
    dtype_list = choose(dtypes, ("float32", "bfloat16"), "dtype", None, SUITE) or ["float32", "bfloat16"]
    thread_list = [check_count(t, "threads", 1, "threads per call") for t in (listify(threads, "thread count") or [2])]
    out = make_out(out)
    files = {"csv": os.path.join(out, CSV_NAME), "json": os.path.join(out, JSON_NAME)}
    rows = read_rows(out, JSON_NAME) if resume else []
    have = {row_key(r) for r in rows if r["status"] == "ok"}
    todo = [(mc, t) for t in thread_list for mc in memory_cases(quick, large, fams, dtype_list, mode_list)]
    skipped = sum(mc.key(t) in have for mc, t in todo)
    todo = [(mc, t) for mc, t in todo if mc.key(t) not in have]
    meta = run_meta({"suite": SUITE, "quick": quick, "large": large, "families": fams, "modes": mode_list,
                     "dtypes": dtype_list, "threads": thread_list})
    meta["calibration"] = calibration = calibrate(calibrate_mb) if calibrate_mb else None
    measured, interrupted = 0, False
    try:
        with progress_bar(progress) as bar:
            task = bar.add_task(SUITE, total=len(todo))
            for mc, t in todo:
                bar.update(task, description=mc.case.what(mc.dtype, t, mc.mode))
                children = {p: start_child(mc.spec(p, t)) for p in PROVIDERS}  # side by side: no timing here
                res = {p: child_result(child, timeout) for p, child in children.items()}
                row = memory_row(mc, t, res)
                rows = [r for r in rows if row_key(r) != row_key(row)] + [row]
                write_csv(rows, files["csv"], FIELDS)
                write_json(rows, meta, files["json"])
                measured += 1
                bar.advance(task)
    except KeyboardInterrupt:
        interrupted = True
    if not os.path.exists(files["json"]):
        write_csv(rows, files["csv"], FIELDS)
        write_json(rows, meta, files["json"])
    return {"suite": SUITE, "out": out, "files": files, "rows": rows, "calibration": calibration,
            "measured": measured, "skipped": skipped, "interrupted": interrupted, "summary": summary(rows)}


def summary(rows) -> str:
    ok = [r for r in rows if r["status"] == "ok"]
    over = [r for r in ok if r["verdict"] != "ok"]
    failed = f"; {len(rows) - len(ok)} failed" if len(ok) < len(rows) else ""
    return f"memory: {len(ok) - len(over)} of {len(ok)} cases within the targets (peak <= torch + " \
           f"{PEAK_TOLERANCE_MB} MB, held <= torch + {HELD_TOLERANCE_MB} MB){failed}"


def _mb(v) -> str:
    return "" if v is None else f"{int(round(v)):,}"  # int: no "-0" for a few freed KB


def make_table(rows):
    from .chapters_data import _table
    t = _table("normlab bench --suite memory: MB above the input (normlab / torch)",
               "layer|shape|dtype|thr|mode|peak n|peak t|held n|held t|malloc n|malloc t|verdict",
               "peak: the call's high-water mark above the RSS before it; held: RSS after the outputs and "
               "grads are freed; malloc: malloc's bytes in use after, all arenas. MB = 2^20 bytes")
    for r in rows:
        shape = r["shape"] + (" cl" if r["layout"] == "channels_last" else "")
        if r["status"] != "ok":
            t.add_row(r["layer"], shape, r["dtype"], str(r["threads"]), r["mode"], *[""] * 6, r["reason"][:60])
            continue
        nums = [_mb(r[f"{p}_{k}"]) for k in ("peak_mb", "held_mb", "malloc_held_mb") for p in PROVIDERS[::-1]]
        ok = r["verdict"] == "ok"
        t.add_row(r["layer"], shape, r["dtype"], str(r["threads"]), r["mode"], *nums,
                  "[green]ok[/]" if ok else f"[red]{r['verdict']}[/]")
    return t


def _footer(result) -> list[str]:
    lines = []
    cal = result.get("calibration")
    if cal:
        lines.append("method check: " + "; ".join(
            f"a call that {'keeps' if k == 'held' else 'frees'} {cal['mb']:g} MB: peak {_mb(v.get('peak_mb'))}, "
            f"held {_mb(v.get('held_mb'))}, malloc held {_mb(v.get('malloc_held_mb'))}" if v["status"] == "ok"
            else f"{k}: {v['reason']}" for k, v in cal.items() if k != "mb"))
    lines += [result["summary"], f"files: {result['files']['csv']}, {result['files']['json']}"]
    if result["interrupted"]:
        lines.append("interrupted: the files hold every case finished before Ctrl-C; continue with --resume")
    return lines


def render(result, width: int = 160) -> str:
    import io
    from rich.console import Console
    buf = io.StringIO()
    Console(file=buf, width=width, force_terminal=False, color_system=None).print(make_table(result["rows"]))
    return buf.getvalue().rstrip("\n") + "\n" + "\n".join(_footer(result))


def print_result(result, console=None) -> None:
    from rich.console import Console
    console = console or (Console() if Console().is_terminal else Console(width=160))
    console.print(make_table(result["rows"]))
    for line in _footer(result):
        console.print(line, highlight=False, soft_wrap=True)
