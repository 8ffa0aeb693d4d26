"""``normlab experiment ddp``: SyncBatchNorm in data-parallel training on CPU (gloo).

Source: the BatchNorm chapter (``normlab.demos.SOURCES``): the moons MLP [2, 64, 64, 64, 2]
with BatchNorm before each Tanh, on ``make_moons(300, noise=0.30, random_state=42)``.

Three runs see the same sequence of global batches of ``nproc * batch`` samples (a
seeded permutation per epoch), from the same initial weights, with SGD:

- ``sync``:   ``nproc`` processes, DistributedDataParallel, ``normlab.nn.SyncBatchNorm``;
  rank r trains on its slice of ``batch`` samples of each global batch.
- ``local``:  the same, with per-rank ``normlab.nn.BatchNorm1d``: statistics of ``batch`` samples.
- ``single``: one process, ``torch.nn.BatchNorm1d`` (the reference), the whole global batch per step.

DistributedDataParallel averages the ranks' gradients, so ``sync`` computes the same
step as ``single`` up to float rounding -- its loss curve tracks the single-process one --
while ``local`` normalises with other statistics and follows another path. The loss of
a distributed step is the mean of the ranks' losses (gathered once, after training).
Evaluation: eval mode on all 300 points (rank 0's model; DistributedDataParallel does not
broadcast buffers each forward: SyncBatchNorm's running statistics are the same on every rank
by construction, per-rank BatchNorm's are rank 0's own).

Speed: after training, steps of ``sync`` and ``local`` alternate in rounds on the same
processes; the per-step overhead of SyncBatchNorm is the median over rounds of the
difference between the two (one
all-gather per layer in the forward, one all-reduce per layer in the backward), shown
beside the latency of those two collectives alone.

Runs as ``normlab experiment ddp --nproc 2`` (this process starts the ranks with
``torch.multiprocessing`` and runs ``single`` itself) or ``torchrun --nproc-per-node 2 -m
normlab.experiments.ddp`` (rank 0 runs ``single`` and reports). A rank that fails stops
the run: the command exits non-zero naming it, and nothing is stored. A finished run is
stored as one record (all three curves) in one transaction.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F

import normlab.nn

from ..demos import source_label
from . import arguments, summaries, sweep
from .._extras import require
from ._mlp import CHAPTER_SEED, chapter_mlp, moons
from .store import DEFAULT_STORE, check_path

EXPERIMENT = "ddp"
CHAPTER = source_label("batchnorm", "the moons MLP with BatchNorm before Tanh")
DEFAULTS = {"nproc": 2, "batch": 4, "steps": 300, "lr": 0.1, "timeout": 60.0}
QUICK_STEPS = 40
TIMING = {"rounds": 15, "steps": 20}  # per round: 20 sync steps, then 20 local steps
QUICK_TIMING = {"rounds": 3, "steps": 10}
FAIL_STEP = 3  # --fail-rank R: rank R raises at this step of the sync run
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _no_buffer_sync() -> dict:
    """DistributedDataParallel's option for "do not broadcast rank 0's buffers every forward"."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel as DDP

    known = inspect.signature(DDP.__init__).parameters
    return {"forward_sync_buffers": False} if "forward_sync_buffers" in known else {"broadcast_buffers": False}


# --------------------------------------------------------------------------
# The runs
# --------------------------------------------------------------------------

def batches(n_data: int, global_batch: int, steps: int, seed: int) -> torch.Tensor:
    """``(steps, global_batch)`` sample indices: consecutive chunks of seeded per-epoch permutations."""
    g = torch.Generator().manual_seed(seed)
    need = steps * global_batch
    stream = torch.cat([torch.randperm(n_data, generator=g) for _ in range(-(-need // n_data))])
    return stream[:need].view(steps, global_batch)


def model(kind: str, seed: int) -> torch.nn.Module:
    """The chapter's MLP: ``"sync"`` with ``normlab.nn.SyncBatchNorm``, ``"local"`` with
    ``normlab.nn.BatchNorm1d``, ``"single"`` (the reference) with ``torch.nn.BatchNorm1d``."""
    if kind == "single":
        return chapter_mlp("batch", seed, torch.nn)
    m = chapter_mlp("batch", seed, normlab.nn)
    return normlab.nn.SyncBatchNorm.convert_sync_batchnorm(m) if kind == "sync" else m


def _train(net, X, y, idx, lr, part, fail=False) -> list[float]:
    """SGD over the global batches ``idx``; this process takes columns ``part`` of each."""
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    losses = []
    for step, rows in enumerate(idx):
        if fail and step == FAIL_STEP:
            raise RuntimeError(f"injected failure at step {step} (--fail-rank)")
        rows = rows[part]
        net.train()
        opt.zero_grad()
        loss = F.cross_entropy(net(X[rows]), y[rows])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _evaluate(net, X, y) -> dict:
    net.eval()
    with torch.no_grad():
        logits = net(X)
    return {"eval_loss": F.cross_entropy(logits, y).item(), "eval_acc": (logits.argmax(1) == y).float().mean().item()}


def single(cfg: dict) -> dict:
    """One process, BatchNorm, the whole global batch per step."""
    X, y = moons()
    idx = batches(len(X), cfg["nproc"] * cfg["batch"], cfg["steps"], cfg["seed"])
    net = model("single", cfg["seed"])
    losses = _train(net, X, y, idx, cfg["lr"], slice(None))
    return {"train_loss": losses, **_evaluate(net, X, y)}


def _step_s(ddp, X, y, rows, lr, n) -> float:
    """Seconds per training step over ``n`` steps, the ranks started together."""
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    ddp.train()  # training mode: batch statistics (evaluation left the models in eval mode)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        opt.zero_grad()
        F.cross_entropy(ddp(X[rows]), y[rows]).backward()
        opt.step()
    return (time.perf_counter() - t0) / n


def _collectives_us(width: int, world: int, n: int = 200) -> dict:
    """Latency of SyncBatchNorm's two collectives alone, for a layer of ``width`` channels."""
    gather = torch.zeros(4 + 2 * width, dtype=torch.float64)
    out = torch.empty(world * gather.numel(), dtype=torch.float64)
    reduce = torch.zeros(2 * width, dtype=torch.float64)
    times = {"all_gather": [], "all_reduce": []}
    for _ in range(n):
        t0 = time.perf_counter()
        _all_gather(out, gather)
        t1 = time.perf_counter()
        dist.all_reduce(reduce)
        times["all_gather"].append(t1 - t0)
        times["all_reduce"].append(time.perf_counter() - t1)
    return {k: 1e6 * statistics.median(v) for k, v in times.items()}


def worker(rank: int, world: int, cfg: dict) -> dict:
    """The distributed runs on one rank of an initialised default group; rank 0's result is complete."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    X, y = moons()
    b = cfg["batch"]
    no_sync = _no_buffer_sync()
    idx = batches(len(X), world * b, cfg["steps"], cfg["seed"])
    part = slice(rank * b, (rank + 1) * b)
    out = {}
    nets = {}
    for kind in ("sync", "local"):
        net = model(kind, cfg["seed"])
        ddp = DDP(net, **no_sync)
        losses = _train(ddp, X, y, idx, cfg["lr"], part, fail=kind == "sync" and cfg["fail_rank"] == rank)
        every = [None] * world
        dist.all_gather_object(every, losses)  # once, after training: the global loss per step
        out[kind] = {"train_loss": [statistics.fmean(v) for v in zip(*every)], **_evaluate(net, X, y)}
        nets[kind] = ddp
    timing = cfg["timing"]
    per_step = {"sync": [], "local": []}
    rows = idx[0][part]
    for _ in range(timing["rounds"]):
        for kind in per_step:
            per_step[kind].append(_step_s(nets[kind], X, y, rows, cfg["lr"], timing["steps"]))
    out["timing"] = {k: 1e3 * statistics.median(v) for k, v in per_step.items()}  # ms per step
    out["timing"].update({f"{k}_min": 1e3 * min(v) for k, v in per_step.items()})
    out["timing"]["overhead"] = 1e3 * statistics.median(a - b for a, b in zip(per_step["sync"], per_step["local"]))
    out["timing"].update(rounds=timing["rounds"], steps=timing["steps"], threads=torch.get_num_threads(),
                         layers=sum(isinstance(m, normlab.nn.SyncBatchNorm) for m in nets["sync"].modules()),
                         collectives_us=_collectives_us(64, world))
    return out


# --------------------------------------------------------------------------
# Launching: this process starts the ranks, or torchrun does
# --------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, cfg: dict, out_dir: str) -> None:
    torch.set_num_threads(cfg["threads"])
    path = os.path.join(out_dir, f"{rank}.pt")
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=cfg["timeout"]))
        torch.save({"ok": worker(rank, world, cfg)}, path)
        dist.destroy_process_group()
    except Exception as err:  # noqa: BLE001 - reported by the launcher, naming this rank
        torch.save({"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}, path)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # now: tearing down a group whose peers wait would wait with them


def _root_cause(results: list[dict]) -> str:
    """The failed rank to name first: one that died or raised on its own, before those that
    raised because a collective with it failed."""
    failed = [(r, res) for r, res in enumerate(results) if "ok" not in res]
    own = [(r, res) for r, res in failed if "SyncBatchNorm: the" not in res.get("error", "")
           and "gloo" not in res.get("error", "")]
    rank, res = (own or failed)[0]
    what = res.get("error") or f"exited with code {res['exitcode']} without a result (killed, or crashed)"
    others = ", ".join(f"rank {r}" for r, _ in failed if r != rank)
    tail = f"; then {others} stopped as well" if others else ""
    return f"normlab experiment ddp: rank {rank} failed: {what.splitlines()[0][:400]}{tail}"


def launch(cfg: dict) -> dict:
    """Start ``cfg["nproc"]`` ranks here; rank 0's result, or SystemExit naming the rank that failed."""
    import torch.multiprocessing as mp

    world = cfg["nproc"]
    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.start_processes(_rank_main, args=(world, _free_port(), cfg, out_dir), nprocs=world,
                                 join=False, start_method="spawn")
        for p in ctx.processes:
            p.join()
        results = []
        for rank, p in enumerate(ctx.processes):
            path = os.path.join(out_dir, f"{rank}.pt")
            res = torch.load(path, weights_only=False) if os.path.exists(path) else {}
            results.append(dict(res, exitcode=p.exitcode))
    if any("ok" not in r or r["exitcode"] != 0 for r in results):
        raise SystemExit(_root_cause(results))
    return results[0]["ok"]


# --------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------

def parse_timeout(value) -> float:
    """Seconds a rank waits for the others in a collective: a number in (0, 3600]."""
    try:
        t = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"timeout: expected seconds such as 60, got {value!r}") from None
    if not 0 < t <= 3600:
        raise ValueError(f"timeout: expected seconds in (0, 3600], got {value}; "
                         f"give the seconds a rank may wait for the others, e.g. --timeout 60")
    return t


def _config(nproc, batch, steps, lr, seed, timeout, quick, fail_rank) -> dict:
    nproc = arguments.parse_count(nproc, "nproc", 2, 64, " (SyncBatchNorm needs at least 2 processes to synchronise)")
    batch = arguments.parse_count(batch, "batch", 1, 150 // nproc, f" (per-rank batch; {nproc} ranks share 300 samples)")
    if nproc * batch < 2:
        raise ValueError(f"batch: expected nproc * batch >= 2 samples per step, got {nproc} * {batch}")
    steps = arguments.parse_count(steps if steps is not None else (QUICK_STEPS if quick else DEFAULTS["steps"]), "steps",
                          FAIL_STEP + 1)
    lr = arguments.parse_lrs([lr])[0]
    timeout = parse_timeout(timeout)
    if fail_rank is not None:
        fail_rank = arguments.parse_count(fail_rank, "fail-rank", 0, nproc - 1,
                                          f" (a rank of the --nproc {nproc} processes)")
    return {"nproc": nproc, "batch": batch, "steps": steps, "lr": lr, "seed": int(seed), "timeout": timeout,
            "fail_rank": fail_rank, "timing": QUICK_TIMING if quick else TIMING,
            "threads": max(1, arguments.cores() // nproc)}


def _compare(dist_res: dict, single_res: dict) -> dict:
    ref = single_res["train_loss"]

    def gap(kind):
        return max(abs(a - b) for a, b in zip(dist_res[kind]["train_loss"], ref))

    t = dist_res["timing"]
    overhead = t["overhead"]  # median over rounds of (sync - local)
    return {"max_loss_gap": {"sync": gap("sync"), "local": gap("local")},
            "overhead_ms": overhead, "overhead_per_layer_us": 1e3 * overhead / max(1, t["layers"])}


def run(nproc: int = DEFAULTS["nproc"], batch: int = DEFAULTS["batch"], steps: int | None = None,
        lr: float = DEFAULTS["lr"], seed: int = CHAPTER_SEED, timeout: float = DEFAULTS["timeout"],
        quick: bool = False, store: str = DEFAULT_STORE, fail_rank: int | None = None, _dist=None) -> dict:
    """The three runs, compared and stored (one record). ``_dist``: rank 0's result when torchrun
    already ran the ranks (this process is rank 0); else this process starts them."""
    try:  # every option checked before any rank starts; fail-rank's range needs nproc
        cfg = _config(nproc, batch, steps, lr, seed, timeout, quick, fail_rank)
    except ValueError as e:
        raise ValueError(f"normlab experiment ddp: {e}") from None
    check_path(store)  # a bad store fails before any training
    require("sklearn", "normlab experiment ddp")  # before any rank starts
    t0 = time.perf_counter()
    dist_res = _dist if _dist is not None else launch(cfg)
    single_res = single(cfg)
    cmp = _compare(dist_res, single_res)
    wall = time.perf_counter() - t0
    config = {k: cfg[k] for k in ("nproc", "batch", "steps", "lr")}
    curves = {"sync": dist_res["sync"]["train_loss"], "local": dist_res["local"]["train_loss"],
              "single": single_res["train_loss"]}
    final = {k: {m: r[m] for m in ("eval_loss", "eval_acc")} for k, r in
             (("sync", dist_res["sync"]), ("local", dist_res["local"]), ("single", single_res))}
    final.update(cmp, timing=dist_res["timing"])
    with sweep.open_store(store) as st:
        stored = st.add(EXPERIMENT, config, cfg["seed"], curves, summaries.finite_or_none(final), wall)
    return summaries.finite_or_none({"chapter_source": CHAPTER, "config": config, "seed": cfg["seed"], "curves": curves,
                             "final": final, "store": str(store), "stored": stored, "wall_s": wall})


def render(r: dict) -> str:
    c, f, t = r["config"], r["final"], r["final"]["timing"]
    gb = c["nproc"] * c["batch"]
    rows = [[name, f"{f[k]['eval_acc']:.3f}", f"{f[k]['eval_loss']:.4f}", f"{r['curves'][k][-1]:.4f}", gap]
            for k, name, gap in (
                ("single", f"1 process, BatchNorm1d, batch {gb}", "(the reference)"),
                ("sync", f"{c['nproc']} processes x batch {c['batch']}, SyncBatchNorm",
                 f"{f['max_loss_gap']['sync']:.2e}"),
                ("local", f"{c['nproc']} processes x batch {c['batch']}, per-rank BatchNorm1d",
                 f"{f['max_loss_gap']['local']:.2e}"))]
    from ..demos._report import table

    tracks = f["max_loss_gap"]["sync"] < 1e-3 <= f["max_loss_gap"]["local"]
    cu = t["collectives_us"]
    return "\n".join([
        f"Data-parallel BatchNorm on CPU (gloo)  [{r['chapter_source']}]", "",
        f"{c['steps']} SGD steps (lr {c['lr']:g}, seed {r['seed']}) on make_moons(300, noise=0.30), "
        f"global batch {gb}, DistributedDataParallel",
        table(rows, ["run", "eval acc", "eval loss", "last train loss", "max |loss - reference| over steps"]), "",
        ("  SyncBatchNorm tracks the single-process run (its loss stays within float rounding of it); "
         "per-rank BatchNorm does not." if tracks else
         "  UNEXPECTED: SyncBatchNorm does not track the single-process run more closely than per-rank BatchNorm."),
        "",
        f"Per-step time, {c['nproc']} processes on this machine ({summaries.plural(t['threads'], 'torch thread')} each; "
        f"{t['rounds']} rounds of {t['steps']} steps each way, alternating; median (min) of the rounds):",
        f"  per-rank BatchNorm1d {t['local']:.3f} ms ({t['local_min']:.3f}), SyncBatchNorm {t['sync']:.3f} ms "
        f"({t['sync_min']:.3f})",
        f"  SyncBatchNorm overhead: {f['overhead_ms']:.3f} ms per step (median of the rounds' differences) = "
        f"{f['overhead_per_layer_us']:.0f} us per layer; {t['layers']} layers, each one all-gather in the forward",
        f"  and one all-reduce in the backward (alone, for 64 channels: all-gather {cu['all_gather']:.0f} us, "
        f"all-reduce {cu['all_reduce']:.0f} us)",
        "",
        f"  store: {r['store']} "
        f"({'stored' if r['stored'] else 'this configuration was stored before; kept the first'})",
    ])


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc", type=arguments.arg(lambda s: arguments.parse_count(s, "nproc", 2, 64)), default=DEFAULTS["nproc"],
                   help="processes (ranks) to start on this machine (default 2)")
    p.add_argument("--batch", type=arguments.arg(lambda s: arguments.parse_count(s, "batch", 1)), default=DEFAULTS["batch"],
                   help="samples per rank per step (default 4)")
    p.add_argument("--steps", type=arguments.arg(lambda s: arguments.parse_count(s, "steps", FAIL_STEP + 1)), default=None,
                   help=f"SGD steps (default {DEFAULTS['steps']}; --quick: {QUICK_STEPS})")
    p.add_argument("--lr", type=arguments.arg(lambda s: arguments.parse_lrs(s)[0]), default=DEFAULTS["lr"],
                   help=f"learning rate (default {DEFAULTS['lr']})")
    p.add_argument("--seed", type=int, default=CHAPTER_SEED, help=f"weight and data seed (default {CHAPTER_SEED})")
    p.add_argument("--timeout", type=arguments.arg(parse_timeout), default=DEFAULTS["timeout"],
                   help="seconds a rank waits for the others in a collective before failing (default 60)")
    p.add_argument("--store", type=arguments.arg_store, default=DEFAULT_STORE,
                   help=f"SQLite results store (default {DEFAULT_STORE})")
    p.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS} steps and a short timing (CI, README)")
    p.add_argument("--fail-rank", type=arguments.arg(lambda s: arguments.parse_count(s, "fail-rank", 0)), default=None,
                   help=f"make this rank (0..nproc-1) fail at step {FAIL_STEP} (to see how a failure is reported)")


def main(argv=None) -> int:
    """``torchrun --nproc-per-node N -m normlab.experiments.ddp [options]`` (without torchrun:
    the same as ``normlab experiment ddp``)."""
    p = argparse.ArgumentParser(prog="python -m normlab.experiments.ddp", description=__doc__.splitlines()[0])
    add_arguments(p)
    args = vars(p.parse_args(argv))
    if "RANK" not in os.environ:  # not under torchrun: start the ranks here
        try:
            result = run(**args)
        except ValueError as e:  # an option out of range: one line, as normlab experiment ddp prints it
            p.exit(2, f"{e}\n")
        print(render(result))
        return 0
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    args["nproc"] = world
    try:
        cfg = _config(**{k: args[k] for k in ("nproc", "batch", "steps", "lr", "seed", "timeout", "quick",
                                               "fail_rank")})
        torch.set_num_threads(cfg["threads"])
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=cfg["timeout"]))
        res = worker(rank, world, cfg)
        dist.destroy_process_group()
    except Exception as err:  # noqa: BLE001
        sys.stderr.write(f"normlab experiment ddp: rank {rank} failed: {type(err).__name__}: {err}\n")
        return 1
    if rank == 0:
        print(render(run(**args, _dist=res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
