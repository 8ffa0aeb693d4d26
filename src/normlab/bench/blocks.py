"""``normlab bench --suite blocks``: normlab inside the blocks that real models are built of.

1. *A Llama-style decoder block* (pre-norm): ``h = x + Attn(RMSNorm(x))``, ``y = h +
   SwiGLU(RMSNorm(h))``, causal self-attention through
   ``torch.nn.functional.scaled_dot_product_attention``, no biases, MLP hidden size
   ``8/3 d`` rounded up to a multiple of 64. d_model 512, 8 heads, batch 4, seq 128
   (``--quick``: d_model 256, 4 heads, batch 2, seq 64). The torch block uses
   ``torch.nn.RMSNorm(eps=1e-6)``; normlab's is a deep copy after ``normlab.convert``
   (same parameters). Mode ``fwd+bwd``: the ``.grad`` of ``x`` and the parameters set to
   ``None``, forward, ``y.backward(dy)``.
2. *Generate* (``GPT2Generate``, ``LlamaGenerate``): a Hugging Face GPT-2 and Llama with random
   weights (d_model 512, 4 layers; ``--quick``: 2), ``generate`` of 64 new tokens at batch 1,
   greedy, with and without ``normlab.convert`` (mode ``generate``; tokens/s = 64 / time;
   ``max Δy`` = 0 when both produce the same tokens). Needs transformers (else skipped).
3. *LayerNorm2d* over the channels of an NCHW tensor: ``normlab.nn.LayerNorm2d(C)``
   against torch's usual ``x.permute(0, 2, 3, 1) -> torch.nn.LayerNorm(C) -> permute
   back``, (8, 64, 32, 32), contiguous (NCHW) and channels_last input, ``fwd`` and
   ``fwd+bwd``.

4. *Convolutional blocks* (:mod:`normlab.bench.cnn_blocks`), eval forward under ``torch.no_grad()``,
   contiguous (NCHW) and channels_last: ``CNNStage`` (conv -> BatchNormAct2d(SiLU), twice;
   (8, 3, 224, 224) in), ``ConvNeXtBlock`` (dw conv 7x7 -> LayerNorm2d -> MLP (GELU), layer
   scale, residual; (8, 96, 56, 56)), ``MBConv`` (EfficientNet; (8, 24, 112, 112), 144 channels
   inside) and ``RegNetBlock`` (RegNetY; (8, 48, 56, 56)), built with timm's norm layers as
   torch Modules; normlab's is a deep copy after ``normlab.convert`` (``--quick``: batch 2, smaller).

float32 and bfloat16, 1 and 2 threads (``--quick``: 1 thread, fewer repeats). Timing and
rows as :mod:`normlab.bench.chapters`: both providers in this process on the same tensors,
interleaved (:func:`normlab.bench.timing.time_interleaved`), median; ``x torch`` = torch's
median / normlab's (>= 1.0: normlab at least as fast). ``max Δy`` is the largest absolute
difference between the two providers' outputs on the row's input (a correctness check).

Files in ``--out``: ``blocks.csv``, ``blocks.json`` (``--resume`` skips rows already there).

    normlab bench --suite blocks --quick
    normlab bench --suite blocks --ops layernorm2d --dtypes bfloat16 --threads 2
    normlab bench --suite blocks --ops CNNStage,ConvNeXtBlock,MBConv,RegNetBlock --threads 1,2
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterable, Mapping

import torch
import torch.nn.functional as F

import normlab.nn
from normlab._backend import get_backend
from normlab.tools.conversion import convert

from .run_context import DEFAULT_OUT, make_out, run_meta
from .cases import DTYPES, Candidate
from . import chapters as _chapters_run
from . import cnn_blocks
from . import hf_models
from . import chapters_data as _chapters
from .chapters_data import FIELDS as _CHAPTER_FIELDS, Case, choose, _table, make_row, row_key
from .report import fmt_time, ratio_and_times

SUITE = "blocks"
CSV_NAME, JSON_NAME = "blocks.csv", "blocks.json"
PROVIDERS = ("torch", "normlab")
MODES = ("fwd", "fwd+bwd", "generate")
FIELDS = _CHAPTER_FIELDS + ("max_abs_diff",)
EPS = 1e-6
_DEFAULTS = {"dtypes": (("float32", "bfloat16"), ("float32", "bfloat16")), "threads": ((1, 2), (1,)),
             "repeats": (15, 5), "warmup": (2, 1), "min_sample_ms": (3.0, 1.0), "max_group_s": (20.0, 3.0)}
# (d_model, heads), (batch, seq, d_model): full, --quick
BLOCK_SIZES = (((512, 8), (4, 128, 512)), ((256, 4), (2, 64, 256)))
LN2D_SHAPE = (8, 64, 32, 32)
CNN_BLOCKS = tuple(cnn_blocks.BLOCKS)  # eval forward, no grad
LAYERS = ("LlamaBlock", "GPT2Generate", "LlamaGenerate", "LayerNorm2d", *CNN_BLOCKS)
GENERATE_SIZES = ((512, 4), (512, 2))  # (d_model, layers): full, --quick


class LlamaBlock(torch.nn.Module):
    """Pre-norm decoder block: RMSNorm -> causal SDPA -> +x; RMSNorm -> SwiGLU -> +h."""

    def __init__(self, d_model: int = 512, n_heads: int = 8, eps: float = EPS, dtype=None):
        super().__init__()
        nn, hidden = torch.nn, -(-(8 * d_model // 3) // 64) * 64
        self.n_heads = n_heads
        self.attn_norm = nn.RMSNorm(d_model, eps=eps, dtype=dtype)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False, dtype=dtype)
        self.o = nn.Linear(d_model, d_model, bias=False, dtype=dtype)
        self.mlp_norm = nn.RMSNorm(d_model, eps=eps, dtype=dtype)
        self.gate_up = nn.Linear(d_model, 2 * hidden, bias=False, dtype=dtype)
        self.down = nn.Linear(hidden, d_model, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, s, 3, self.n_heads, d // self.n_heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        h = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        gate, up = self.gate_up(self.mlp_norm(h)).chunk(2, dim=-1)
        return h + self.down(F.silu(gate) * up)


class PermuteLayerNorm2d(torch.nn.Module):
    """torch's usual channels-first LayerNorm: permute to NHWC, ``nn.LayerNorm(C)``, permute back."""

    def __init__(self, num_channels: int, eps: float = EPS, dtype=None):
        super().__init__()
        self.norm = torch.nn.LayerNorm(num_channels, eps=eps, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def cases(quick: bool = False) -> tuple[tuple[Case, tuple[str, ...]], ...]:
    """``((case, modes), ...)`` of the suite at the full or ``--quick`` size."""
    (d, heads), shape = BLOCK_SIZES[1 if quick else 0]
    gen = [(Case(name, GENERATE_SIZES[1 if quick else 0], (1, hf_models.PROMPT_TOKENS)), ("generate",))
           for name in ("GPT2Generate", "LlamaGenerate") if hf_models.available()]
    return ((Case("LlamaBlock", (d, heads), shape), ("fwd+bwd",)), *gen,
            (Case("LayerNorm2d", (LN2D_SHAPE[1],), LN2D_SHAPE), ("fwd", "fwd+bwd")),
            (Case("LayerNorm2d", (LN2D_SHAPE[1],), LN2D_SHAPE, layout="channels_last"), ("fwd", "fwd+bwd")),
            *((Case(name, cnn_blocks.BLOCKS[name][1 if quick else 0][1], cnn_blocks.BLOCKS[name][1 if quick else 0][2],
                    layout=layout), ("fwd",))
              for name in CNN_BLOCKS for layout in ("contiguous", "channels_last")))


def build_modules(case: Case, dtype: torch.dtype, gen: torch.Generator) -> dict[str, torch.nn.Module]:
    """``{"torch": module, "normlab": twin}`` with the same (seeded, perturbed) parameters."""
    if case.name == "LlamaBlock":
        tm = LlamaBlock(*case.args, dtype=dtype)
        with torch.no_grad():
            for p in tm.parameters():
                p.copy_((torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5 if p.dim() > 1 else
                         1.0 + 0.1 * torch.randn(p.shape, generator=gen)).to(dtype))
        return {"torch": tm, "normlab": convert(copy.deepcopy(tm))}
    if case.name in CNN_BLOCKS:
        cls = next(c for c, args, _ in cnn_blocks.BLOCKS[case.name] if args == case.args)
        tm = cnn_blocks.perturb(cls(*case.args, dtype=dtype), gen).eval()
        if case.layout == "channels_last":
            tm = tm.to(memory_format=torch.channels_last)
        return {"torch": tm, "normlab": convert(copy.deepcopy(tm))}
    tm = PermuteLayerNorm2d(*case.args, dtype=dtype)
    with torch.no_grad():
        for p in tm.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen).to(dtype))
    nm = normlab.nn.LayerNorm2d(*case.args, eps=EPS, dtype=dtype)
    nm.load_state_dict(tm.norm.state_dict())
    return {"torch": tm, "normlab": nm}


def candidates(case: Case, dtype: str, mode: str, seed: int = 0):
    """``({provider: Candidate}, max |y_torch - y_normlab|)`` on the same seeded tensors."""
    dt, gen = DTYPES[dtype], torch.Generator().manual_seed(seed)
    if mode == "generate":
        return _generate_candidates(case, dt, seed)
    fmt = torch.channels_last if case.layout == "channels_last" else torch.contiguous_format
    x, dy = (torch.randn(case.shape, generator=gen).to(dt).contiguous(memory_format=fmt) for _ in range(2))
    mods = build_modules(case, dt, gen)
    with torch.no_grad():
        y = {p: m(x) for p, m in mods.items()}
    diff = (y["torch"].float() - y["normlab"].float()).abs().max().item()
    leaf = x.clone().requires_grad_(True)

    def candidate(m):
        params = tuple(m.parameters())

        def step():
            for t in (leaf, *params):
                t.grad = None
            m(leaf).backward(dy)

        def infer():
            with torch.no_grad():
                return m(x)

        def prepare():
            m.train(case.name not in CNN_BLOCKS)
            fn = step if mode == "fwd+bwd" else infer if case.name in CNN_BLOCKS else (lambda: m(x))
            for _ in range(3):
                fn()
            return fn
        return Candidate(prepare)
    return {p: candidate(m) for p, m in mods.items()}, diff


def _generate_candidates(case: Case, dt: torch.dtype, seed: int):
    """Both models' ``generate`` of 64 tokens on one prompt; Δ = 0 when the tokens agree."""
    mods, ids = hf_models.build(case.name, *case.args, dtype=dt, seed=seed), hf_models.prompt(seed)
    tokens = {p: hf_models.generate(m, ids) for p, m in mods.items()}
    diff = float((tokens["torch"] != tokens["normlab"]).sum().item())
    return {p: Candidate(lambda m=m: (lambda: hf_models.generate(m, ids))) for p, m in mods.items()}, diff


def run_blocks(layers: Iterable[str] | str | None = None, modes: Iterable[str] | str | None = None,
               dtypes: Iterable[str] | str | None = None, threads: Iterable[int] | str | None = None,
               out: str = DEFAULT_OUT, quick: bool = False, resume: bool = False,
               repeats: int | None = None, warmup: int | None = None,
               min_sample_ms: float | None = None, max_group_s: float | None = None,
               progress: bool = True, on_group: Callable[[dict], None] | None = None) -> dict:
    """Run the suite; arguments and result as :func:`normlab.bench.chapters.run_chapters`
    (``layers`` from ``LAYERS``, any case)."""
    q = 1 if quick else 0
    names = choose(layers, LAYERS, "layer", suite="blocks") or list(LAYERS)
    modes = choose(modes, MODES, "mode", {"forward": ("fwd",), "forward+backward": ("fwd+bwd",)},
                    suite="blocks") or list(MODES)
    dtypes = choose(dtypes, list(DTYPES), "dtype", suite="blocks") or list(_DEFAULTS["dtypes"][q])
    thread_list, repeats, warmup, min_sample_s, max_group_s = _chapters_run.timing_options(
        _DEFAULTS, quick, threads, repeats, warmup, min_sample_ms, max_group_s)

    out = make_out(out)
    files = {"csv": os.path.join(out, CSV_NAME), "json": os.path.join(out, JSON_NAME)}
    rows = _chapters.read_rows(out, JSON_NAME) if resume else []
    have = {row_key(r) for r in rows}
    plan, skipped = [], 0
    for n_threads in thread_list:
        for dtype in dtypes:
            for case, case_modes in cases(quick):
                if case.name not in names:
                    continue
                want = [m for m in case_modes if m in modes]
                left = [m for m in want if (case.label, case.shape_str, case.layout, dtype,
                                            str(n_threads), m) not in have]
                skipped += len(want) - len(left)
                if left:
                    plan.append((n_threads, case, dtype, left))

    meta = run_meta({"suite": SUITE, "layers": names, "modes": modes, "dtypes": dtypes, "threads": thread_list,
                  "quick": quick, "repeats": repeats, "warmup": warmup,
                  "min_sample_ms": min_sample_s * 1e3, "max_group_s": max_group_s})
    warnings: list[str] = []
    meta.update(suite=SUITE, normlab_backend=get_backend(), warnings=warnings)
    rows, measured, interrupted = _chapters_run.run_plan(
        plan, suite=SUITE, out=out, rows=rows, files=files, meta=meta, warnings=warnings,
        progress=progress, on_group=on_group, providers=PROVIDERS, cell=_cell,
        timing=dict(repeats=repeats, warmup=warmup, min_sample_s=min_sample_s, max_total_s=max_group_s),
        build=candidates,
        make=lambda case, dtype, n_threads, mode, timed, diff: make_row(case, dtype, n_threads, mode, timed)
        | {"max_abs_diff": diff},
        write_csv=lambda rows_, path: _chapters.write_csv(rows_, path, FIELDS))
    return {"suite": SUITE, "out": out, "files": files, "rows": rows, "measured": measured,
            "skipped": skipped, "interrupted": interrupted, "warnings": warnings, "summary": summary(rows)}


def _cell(row: Mapping) -> str:
    if row["status"] != "ok":
        return f"{row['status']}: {row['reason']}"
    return (f"torch {fmt_time(row['torch_us'] * 1e-6)}, normlab {fmt_time(row['normlab_us'] * 1e-6)}, "
            f"{row['x_torch']:.2f}x, max Δy {row['max_abs_diff']:.2g}")


def summary(rows: Iterable[Mapping]) -> str:
    ok = [r for r in rows if r["status"] == "ok"]
    text = f"blocks: {sum(r['x_torch'] >= 1.0 for r in ok)} of {len(ok)} rows >= 1.0x"
    blocks = [f"{r['dtype']} t{r['threads']} {r['x_torch']:.2f}x" for r in ok if r["name"] == "LlamaBlock"]
    return text + ("; Llama block " + ", ".join(blocks) if blocks else "")


def _sort_key(r: Mapping):
    return (LAYERS.index(r["name"]) if r["name"] in LAYERS else 9, r["layout"] == "channels_last", list(DTYPES).index(r["dtype"])
            if r["dtype"] in DTYPES else 9, int(r["threads"]), MODES.index(r["mode"]) if r["mode"] in MODES else 9)


def make_tables(rows: Iterable[Mapping]) -> list:
    table = _table("normlab bench --suite blocks", "layer|shape|dtype|thr|mode|torch|normlab|×torch|max Δy",
                   "time: median per call; ×torch = torch time / normlab time (>= 1: normlab at least as fast); "
                   "LlamaBlock: torch.nn.RMSNorm vs after normlab.convert; *Generate: 64 tokens at batch 1 (max Δy: "
                   "tokens that differ); LayerNorm2d: permute -> "
                   "torch.nn.LayerNorm -> permute vs normlab.nn.LayerNorm2d; CNNStage, ConvNeXtBlock, MBConv, "
                   "RegNetBlock: eval forward, timm's norm layers vs after normlab.convert; max Δy: largest output "
                   "difference")
    last = None
    for r in sorted(rows, key=_sort_key):
        ratio, times = ratio_and_times(r)
        group = (r["layer"], r["shape"], r["layout"])
        if last is not None and group != last:
            table.add_section()
        head = ["", ""] if group == last else [r["layer"], r["shape"] + (" cl" if r["layout"] == "channels_last" else "")]
        last = group
        diff = "" if r.get("max_abs_diff") is None else f"{r['max_abs_diff']:.2g}"
        table.add_row(*head, r["dtype"], str(r["threads"]), r["mode"], *times, ratio, diff)
    return [table] if table.row_count else []


def render(result: Mapping, width: int = 140) -> str:
    return _chapters.render(result, width, tables=make_tables)


def print_result(result: Mapping, console=None) -> None:
    _chapters.print_result(result, console, tables=make_tables)
