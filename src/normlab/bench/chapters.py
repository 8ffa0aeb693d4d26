"""``normlab bench --suite chapters``: normlab's module calls against torch.nn's at the chapters' sizes.

1. *Module calls.* For each layer the source chapters use -- BatchNorm1d/2d/3d, LayerNorm,
   RMSNorm, GroupNorm, InstanceNorm1d/2d -- a ``torch.nn`` module and the ``normlab.nn``
   module built with the same constructor arguments and dtype, holding the same parameters
   and buffers (``load_state_dict`` from the torch one), are called on the same input
   tensor. The fused adds compare ``normlab.functional.add_layer_norm``/``add_rms_norm``
   with ``h = x + r`` then ``torch.nn.functional.layer_norm``/``rms_norm`` (both return
   ``(y, h)``). Modes: ``fwd`` -- ``module.train()``, ``x`` without grad, the parameters
   with (a training step's forward: the graph is built, BatchNorm's running statistics are
   updated); ``fwd+bwd`` -- the same with ``x`` requiring grad, then ``y.backward(dy)``
   with a fixed random ``dy`` (``(dy, dh)`` for the fused adds), the ``.grad`` of ``x``
   and the parameters set to ``None`` first, as ``optimizer.zero_grad()`` does;
   ``eval fwd`` -- ``module.eval()`` under ``torch.no_grad()``. float32 and bfloat16
   (module and input), 1 and 2 threads (``torch.set_num_threads``, restored afterwards).

2. *The chapter's training loop.* ``Sequential(Linear(2, 64), BatchNorm1d(64), Tanh(),
   Linear(64, 64), BatchNorm1d(64), Tanh(), Linear(64, 64), BatchNorm1d(64), Tanh(),
   Linear(64, 2))`` built after ``torch.manual_seed(123)``. A *run* deep-copies that
   prebuilt model and takes 30 full-batch SGD steps (lr=2.0, cross-entropy: zero_grad,
   forward, loss, backward, step) on 300 two-moons points (scikit-learn's
   ``make_moons(300, noise=0.30, random_state=42)`` when installed, else its recipe drawn
   with numpy; the output says which). normlab runs the same prebuilt model after
   ``normlab.convert`` (once, untimed). Also with LayerNorm(64). float32 only.

Both providers of a row run in this process on the same tensors, interleaved in rotating
order by :func:`normlab.bench.timing.time_interleaved` (the first call is timed apart,
never in the median). ``x torch`` = torch's median time
/ normlab's: >= 1.0 means normlab is at least as fast (for the loop: normlab's runs per
second / torch's). Compare within a row; the load drifts between rows.

Files in ``--out`` (default ``bench-results/``): ``chapters.csv``, ``chapters.json``,
rewritten after every row (Ctrl-C keeps them; ``--resume`` skips rows already there).

    normlab bench --suite chapters --quick      # float32, 1 thread, few repeats: < 1 min
    normlab bench --suite chapters              # float32 + bfloat16, 1 and 2 threads
    normlab bench --suite chapters --ops layernorm,loop --modes fwd+bwd --threads 2

``--ops``: layer class names (any case), ``add_layer_norm``, ``add_rms_norm``, ``loop``
(both loops), ``loop_batchnorm1d``, ``loop_layernorm``. ``--modes``: ``fwd``,
``fwd+bwd``, ``eval fwd``. From Python: ``run_chapters(layers="layernorm", threads=1)``.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import os
from collections.abc import Callable, Iterable, Mapping

import torch
import torch.nn.functional as F

import normlab.nn
from normlab._backend import get_backend
from normlab.tools.conversion import convert
import normlab.functional as NF

from .cases import DTYPES, Candidate, exception_status
from .chapters_data import (
    _DEFAULTS, CASES, CSV_NAME, EPS, JSON_NAME, LAYER_ALIASES, LAYERS, LOOP_MODE, LOOPS, MODE_ALIASES, MODES,
    PROVIDERS, RMS_EPS, SUITE, Case, choose, make_row, read_rows, row_key, summary, write_csv,
)
from .chapters_data import KEY_FIELDS, print_result, render  # noqa: F401 (the suite's names, for the CLI and tests)
from .run_context import (DEFAULT_OUT, REPEATS_MEANING, WARMUP_MEANING, check_count, get_threads, listify, make_out,
                          run_meta, set_threads, thread_guard, progress_bar)
from .report import fmt_time, write_json
from .timing import Timing, time_interleaved

# --------------------------------------------------------------------------
# What each provider runs
# --------------------------------------------------------------------------

def _randn(shape, dtype, gen, layout="contiguous") -> torch.Tensor:
    t = torch.randn(shape, generator=gen).to(dtype)
    return t.contiguous(memory_format=torch.channels_last) if layout == "channels_last" else t


def build_modules(case: Case, dtype: torch.dtype, gen: torch.Generator) -> dict[str, torch.nn.Module]:
    """``{"torch": torch.nn module, "normlab": normlab.nn twin}``: same arguments and dtype; the
    torch module's parameters are perturbed (seeded), then copied into the twin."""
    kwargs = dict(case.kwargs, dtype=dtype)
    tm = getattr(torch.nn, case.name)(*case.args, **kwargs)
    with torch.no_grad():
        for p in tm.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen).to(dtype))
    nm = getattr(normlab.nn, case.name)(*case.args, **kwargs)
    nm.load_state_dict(tm.state_dict())
    return {"torch": tm, "normlab": nm}


def _fused(case: Case, dtype: torch.dtype, gen: torch.Generator):
    """``({provider: f(x, r) -> (y, h)}, parameters)`` for ``add_layer_norm``/``add_rms_norm``."""
    n = case.args[0]
    w = torch.nn.Parameter((1.0 + 0.1 * torch.randn(n, generator=gen)).to(dtype))
    if case.name == "add_rms_norm":
        return {"torch": lambda x, r: (F.rms_norm(h := x + r, (n,), w, RMS_EPS), h),
                "normlab": lambda x, r: NF.add_rms_norm(x, r, (n,), w, RMS_EPS)}, (w,)
    b = torch.nn.Parameter((0.1 * torch.randn(n, generator=gen)).to(dtype))
    return {"torch": lambda x, r: (F.layer_norm(h := x + r, (n,), w, b, EPS), h),
            "normlab": lambda x, r: NF.add_layer_norm(x, r, (n,), w, b, EPS)}, (w, b)


def layer_candidates(case: Case, dtype: str, mode: str, seed: int = 0) -> dict[str, Candidate]:
    """``{provider: Candidate}`` for one case in one mode, both on the same (seeded) tensors."""
    dt = DTYPES[dtype]
    gen = torch.Generator().manual_seed(seed)
    x, dy = _randn(case.shape, dt, gen, case.layout), _randn(case.shape, dt, gen, case.layout)
    if case.name.startswith("add_"):
        fns, params = _fused(case, dt, gen)
        r, dh = _randn(case.shape, dt, gen), _randn(case.shape, dt, gen)
        args, grads = (x, r), (dy, dh)
        models = {p: (f, params) for p, f in fns.items()}
    else:
        args, grads = (x,), (dy,)
        models = {p: (m, tuple(m.parameters())) for p, m in build_modules(case, dt, gen).items()}
    leaves = tuple(a.clone().requires_grad_(True) for a in args)  # fwd+bwd's inputs
    eval_mode = mode == "eval fwd"

    def candidate(model, params):
        def forward():
            return model(*args)

        def step():
            for t in leaves + params:
                t.grad = None
            torch.autograd.backward(model(*leaves), grads)

        def prepare():  # train/eval is set once per row; three untimed calls (first-call time)
            if isinstance(model, torch.nn.Module):  # so that the timer calibrates on a warm call
                model.train(not eval_mode)
            fn = step if mode == "fwd+bwd" else forward
            for _ in range(3):
                fn()
            return fn
        return Candidate(prepare, torch.no_grad if eval_mode else contextlib.nullcontext)
    return {p: candidate(*mp) for p, mp in models.items()}


# --------------------------------------------------------------------------
# The chapter's training loop
# --------------------------------------------------------------------------

def moons(n_samples: int = 300, noise: float = 0.30, random_state: int = 42):
    """``(X float32 [n, 2], y int64 [n], source)``: scikit-learn's ``make_moons`` when it is
    installed, else its recipe drawn with numpy (other values, same shape and classes)."""
    try:
        from sklearn.datasets import make_moons
        X, y = make_moons(n_samples=n_samples, noise=noise, random_state=random_state)
        source = f"sklearn make_moons(n_samples={n_samples}, noise={noise}, random_state={random_state})"
    except ImportError:
        import numpy as np
        rng, n_out = np.random.RandomState(random_state), n_samples // 2
        t_out, t_in = np.linspace(0, np.pi, n_out), np.linspace(0, np.pi, n_samples - n_out)
        X = np.concatenate([np.stack([np.cos(t_out), np.sin(t_out)], 1),
                            np.stack([1 - np.cos(t_in), 0.5 - np.sin(t_in)], 1)])
        y = (np.arange(n_samples) >= n_out).astype(np.int64)
        perm = rng.permutation(n_samples)
        X, y = (X + rng.normal(scale=noise, size=X.shape))[perm], y[perm]
        source = f"numpy two-moons (sklearn not installed; n={n_samples}, noise={noise}, seed={random_state})"
    return torch.tensor(X, dtype=torch.float32), torch.tensor(y, dtype=torch.int64), source


def chapter_mlp(norm: str = "BatchNorm1d", seed: int = 123) -> torch.nn.Sequential:
    """The chapter's MLP [2, 64, 64, 64, 2] with ``torch.nn.<norm>(64)`` before each Tanh."""
    torch.manual_seed(seed)
    nn = torch.nn
    layers = []
    for i, o in ((2, 64), (64, 64), (64, 64)):
        layers += [nn.Linear(i, o), getattr(nn, norm)(64), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(64, 2))


def train(model: torch.nn.Module, X: torch.Tensor, y: torch.Tensor, steps: int = 30,
          lr: float = 2.0, record: bool = False) -> list[float] | None:
    """Full-batch SGD with cross-entropy, in place. ``record``: return the loss before each
    step and after the last one (``steps + 1`` floats); else ``None`` (no ``.item()`` syncs)."""
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model(X), y)
        if record:
            losses.append(loss.item())
        loss.backward()
        opt.step()
    if record:
        with torch.no_grad():
            losses.append(loss_fn(model(X), y).item())
        return losses
    return None


def loop_candidates(case: Case, data) -> dict[str, Candidate]:
    """A run per call: deep-copy the prebuilt model, then :func:`train` it for 30 steps."""
    X, y, _ = data
    proto = chapter_mlp(case.args[0])
    protos = {"torch": proto, "normlab": convert(copy.deepcopy(proto))}
    return {p: Candidate(lambda m=m: (lambda: train(copy.deepcopy(m), X, y))) for p, m in protos.items()}


# --------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------

def timing_options(defaults: Mapping, quick: bool, threads, repeats, warmup, min_sample_ms, max_group_s):
    """``(thread counts, repeats, warmup, min_sample_s, max_group_s)`` of a module-call suite: each
    given value, else the suite's ``defaults[key][quick]``; thread counts must be >= 1."""
    q = 1 if quick else 0
    thread_list = [int(t) for t in (listify(threads, "thread count") or defaults["threads"][q])]
    if min(thread_list) < 1:
        raise ValueError(f"normlab bench: expected thread counts >= 1, got {thread_list}")
    pick = (lambda v, k: defaults[k][q] if v is None else float(v))
    repeats = check_count(defaults["repeats"][q] if repeats is None else repeats, "repeats", 1, REPEATS_MEANING)
    warmup = check_count(defaults["warmup"][q] if warmup is None else warmup, "warmup", 0, WARMUP_MEANING)
    return (thread_list, repeats, warmup,
            1e-3 * pick(min_sample_ms, "min_sample_ms"), pick(max_group_s, "max_group_s"))


def run_plan(plan, *, suite: str, out: str, rows: list, files: Mapping[str, str], meta: dict,
             warnings: list, progress: bool, on_group: Callable[[dict], None] | None, providers,
             cell: Callable[[Mapping], str], timing: dict, build: Callable, make: Callable,
             write_csv: Callable) -> tuple[list, int, bool]:
    """Measure every ``(threads, case, dtype, modes)`` of ``plan`` (the module-call suites:
    chapters, blocks) and rewrite the CSV and JSON files after every row.

    ``build(case, dtype, mode)`` gives ``(candidates, extra)`` -- a case that cannot be built
    becomes a row with its error, not a crash; ``make(case, dtype, threads, mode, timed, extra)``
    the row; ``timing``: :func:`time_interleaved`'s options. Ctrl-C stops with the files holding
    every finished row. Returns ``(rows, measured, interrupted)``.
    """
    measured, interrupted = 0, False
    saved_threads = get_threads()
    bar = progress_bar(progress)
    console = bar.console
    try:
        with bar:
            task = bar.add_task(suite, total=sum(len(m) for *_, m in plan))
            current = None
            for n_threads, case, dtype, left in plan:
                if n_threads != current:
                    set_threads(n_threads)
                    current = n_threads
                    guard = thread_guard(n_threads, warnings, bar.console if progress else None)
                for mode in left:
                    what = case.what(dtype, n_threads, mode)
                    bar.update(task, description=what)
                    extra = None
                    try:
                        cands, extra = build(case, dtype, mode)
                    except Exception as e:  # noqa: BLE001
                        cands, why = {}, exception_status(e)
                        timed = {p: Timing(status=why[0], reason=why[1]) for p in providers}
                    else:
                        timed = time_interleaved(cands, after_call=guard, **timing)
                    row = make(case, dtype, n_threads, mode, timed, extra)
                    del cands, timed
                    rows = [r for r in rows if row_key(r) != row_key(row)] + [row]
                    meta["loadavg_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
                    write_csv(rows, files["csv"])
                    write_json(rows, meta, files["json"])
                    measured += 1
                    if progress:
                        bar.console.print(f"  {what}: {cell(row)}", highlight=False, soft_wrap=True)
                    bar.advance(task)
                    if on_group is not None:
                        on_group(row)
                gc.collect()
    except KeyboardInterrupt:
        interrupted = True
        console.print(f"[yellow]interrupted: {measured} rows measured in this run are kept in {out}[/]")
    finally:
        torch.set_num_threads(saved_threads)
    if not os.path.exists(files["json"]):  # nothing measured: still leave valid files
        write_csv(rows, files["csv"])
        write_json(rows, meta, files["json"])
    return rows, measured, interrupted


def run_chapters(layers: Iterable[str] | str | None = None, modes: Iterable[str] | str | None = None,
                 dtypes: Iterable[str] | str | None = None, threads: Iterable[int] | str | None = None,
                 out: str = DEFAULT_OUT, quick: bool = False, resume: bool = False,
                 repeats: int | None = None, warmup: int | None = None,
                 min_sample_ms: float | None = None, max_group_s: float | None = None,
                 progress: bool = True, on_group: Callable[[dict], None] | None = None) -> dict:
    """Run the suite; write ``chapters.csv``/``chapters.json`` into ``out`` after every row.

    ``layers``: from ``LAYERS`` (any case) or ``"loop"``; ``modes``: from ``MODES`` (the loops
    have their own); ``dtypes``, ``threads``, ``quick``, ``resume``, ``repeats``... as in
    ``run_bench``; the loops run in float32 only, when it is chosen. ``on_group(row)`` runs
    after each row is written. Ctrl-C stops with the files holding every finished row
    (``interrupted=True``). Returns a JSON-serialisable dict: ``suite``, ``rows``, ``files``,
    ``summary``, ``measured``, ``skipped``, ``interrupted``, ``warnings``, ``data``.
    """
    q = 1 if quick else 0
    names = choose(layers, LAYERS, "layer", LAYER_ALIASES) or list(LAYERS)
    modes = choose(modes, MODES, "mode", MODE_ALIASES) or list(MODES)
    dtypes = choose(dtypes, list(DTYPES), "dtype") or list(_DEFAULTS["dtypes"][q])
    thread_list, repeats, warmup, min_sample_s, max_group_s = timing_options(
        _DEFAULTS, quick, threads, repeats, warmup, min_sample_ms, max_group_s)

    out = make_out(out)
    files = {"csv": os.path.join(out, CSV_NAME), "json": os.path.join(out, JSON_NAME)}
    rows = read_rows(out) if resume else []
    have = {row_key(r) for r in rows}
    loops = [c for c in LOOPS if c.name in names and "float32" in dtypes]
    data = moons() if loops else None
    plan, skipped = [], 0  # (threads, case, dtype, modes to measure)
    for n_threads in thread_list:
        todo = [(c, d, modes) for d in dtypes for c in CASES if c.name in names]
        for case, dtype, case_modes in todo + [(c, "float32", [LOOP_MODE]) for c in loops]:
            left = [m for m in case_modes if (case.label, case.shape_str, case.layout, dtype,
                                              str(n_threads), m) not in have]
            skipped += len(case_modes) - len(left)
            if left:
                plan.append((n_threads, case, dtype, left))

    meta = run_meta({"suite": SUITE, "layers": names, "modes": modes, "dtypes": dtypes,
                  "threads": thread_list, "quick": quick, "repeats": repeats, "warmup": warmup,
                  "min_sample_ms": min_sample_s * 1e3, "max_group_s": max_group_s})
    warnings: list[str] = []
    meta.update(suite=SUITE, data=data[2] if data else None, normlab_backend=get_backend(),
                warnings=warnings)
    rows, measured, interrupted = run_plan(
        plan, suite=SUITE, out=out, rows=rows, files=files, meta=meta, warnings=warnings,
        progress=progress, on_group=on_group, providers=PROVIDERS, cell=_cell,
        timing=dict(repeats=repeats, warmup=warmup, min_sample_s=min_sample_s, max_total_s=max_group_s),
        build=lambda case, dtype, mode: (loop_candidates(case, data) if mode == LOOP_MODE else
                                         layer_candidates(case, dtype, mode), None),
        make=lambda case, dtype, n_threads, mode, timed, _: make_row(case, dtype, n_threads, mode, timed,
                                                                      meta["data"] or ""),
        write_csv=write_csv)
    return {"suite": SUITE, "out": out, "files": files, "rows": rows, "measured": measured,
            "skipped": skipped, "interrupted": interrupted, "warnings": warnings,
            "data": meta["data"], "summary": summary(rows)}


def _cell(row: Mapping) -> str:
    if row["status"] != "ok":
        return f"{row['status']}: {row['reason']}"
    return (f"torch {fmt_time(row['torch_us'] * 1e-6)}, normlab {fmt_time(row['normlab_us'] * 1e-6)}, "
            f"{row['x_torch']:.2f}x")
