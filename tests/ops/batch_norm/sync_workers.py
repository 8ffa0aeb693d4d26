"""What the ranks of the spawned groups run (module-level functions: a spawned child imports them).

One spawn per world size, many checks each: process start-up dominates a run.
"""

from __future__ import annotations

import datetime
import os
import time

import pytest
import torch
import torch.distributed as dist

import normlab
from normlab.nn import SyncBatchNorm

from . import spawn
from .sync_cases import FAULT_TIMEOUT_S, in_layout, mlp, slice_of


def run_case(rank, case, group=None, device="cpu"):
    """Two training steps (the first with a backward), then evaluation on rank 0 alone; results on the CPU."""
    m = SyncBatchNorm(case["c"], dtype=case["dtype"], process_group=group, device=device, **case["kwargs"])
    with torch.no_grad():
        if m.weight is not None:
            m.weight.copy_(case["w"])
        if m.bias is not None:
            m.bias.copy_(case["b"])

    def part(key, sizes="sizes"):
        return in_layout(slice_of(case[key], case[sizes], rank).to(device), case["layout"])

    out = {}
    with normlab.use_backend(case["backend"]):
        x = part("x").requires_grad_()
        y = m(x)
        (y * part("dy")).sum().backward()
        out.update(y=y.detach(), dx=x.grad, y_channels_last=y.dim() == 4 and y.is_contiguous(
            memory_format=torch.channels_last) and not y.is_contiguous())
        out["dw"] = m.weight.grad if m.weight is not None else None
        out["db"] = m.bias.grad if m.bias is not None else None
        m(part("x2", "sizes2"))  # no autograd: the plain path
        if rank == 0:  # evaluation on one rank alone: it must not wait for the others
            out["y_eval"] = m.eval()(case["x_eval"].to(device))
    out.update(rm=m.running_mean, rv=m.running_var, nbt=m.num_batches_tracked)
    return {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in out.items()}


def compiled(rank, sizes, x, dy):
    """Two steps of an MLP with SyncBatchNorm under ``torch.compile(fullgraph=True)``."""
    model = mlp(SyncBatchNorm)
    step = torch.compile(model, fullgraph=True, backend="aot_eager")  # fakes, functionalisation, autograd
    for _ in range(2):
        y = step(slice_of(x, sizes, rank))
        (y * slice_of(dy, sizes, rank)).sum().backward()
    return dict(y=y.detach(), grads={k: p.grad for k, p in model.named_parameters()},
                buffers=dict(model.named_buffers()))


def _timed(fn):
    start = time.monotonic()
    try:
        fn()
    except RuntimeError as err:
        return str(err), time.monotonic() - start
    return "no error", time.monotonic() - start


def faults(rank, done):
    """Rank 1 first stays silent in a backward (rank 0 times out), then, in a fresh group, dies
    before a forward (rank 0 fails at once). ``done(out)``: rank 1 reports before it dies."""
    out = {}
    timeout = datetime.timedelta(seconds=FAULT_TIMEOUT_S)
    with normlab.use_backend("ref"):
        m = SyncBatchNorm(3, process_group=dist.new_group([0, 1], timeout=timeout))
        y = m(torch.randn(4, 3, requires_grad=True))
        if rank == 1:  # ran the forward, never runs the backward: rank 0 waits in the all-reduce
            time.sleep(FAULT_TIMEOUT_S + 0.5)
        else:
            out["silent"] = _timed(lambda: y.sum().backward())
        m = SyncBatchNorm(3, process_group=dist.new_group([0, 1], timeout=timeout))  # the first one is spent
        m(torch.randn(4, 3))  # one good step together
        if rank == 1:
            done(out)
            os._exit(7)
        out["crash"] = _timed(lambda: m(torch.randn(4, 3)))
    return out


def world_2_worker(rank, world, cases, compile_case, ddp_config):
    from normlab.experiments import ddp

    out = {"cases": [run_case(rank, case) for case in cases]}
    out["compiled"] = compiled(rank, *compile_case)
    out["ddp"] = ddp.worker(rank, world, ddp_config)  # the example's distributed runs
    out["faults"] = faults(rank, lambda f: spawn.report(dict(out, faults=f)))
    return out


def _subset(rank, case, members):
    """Ranks ``members`` synchronise over their own group; the others are refused."""
    group = dist.new_group(members)  # every rank of the world takes part in creating it
    if rank in members:
        return run_case(members.index(rank), case, group)
    with pytest.raises(RuntimeError, match="not a member of the layer's process_group"):
        SyncBatchNorm(3, process_group=group)(torch.randn(4, 3))
    return None


def _error(fn) -> str:
    try:
        fn()
    except (RuntimeError, ValueError) as err:
        return str(err)
    return "no error"


def _disagreements(rank):
    """Ranks that disagree: each must raise on every rank, and leave the group usable."""
    errors = {}
    m = SyncBatchNorm(5 if rank == 1 else 4)
    errors["channels"] = _error(lambda: m(torch.randn(3, m.num_features)))
    dtype = torch.float64 if rank == 2 else torch.float32
    errors["dtype at the first call"] = _error(lambda: SyncBatchNorm(4, dtype=dtype)(torch.randn(3, 4, dtype=dtype)))
    m = SyncBatchNorm(4)
    m(torch.randn(3, 4))  # the ranks agree at first ...
    if rank == 1:  # ... then rank 1 alone switches to float64
        m.double()
    errors["dtype later"] = _error(lambda: m(torch.randn(3, 4, dtype=m.weight.dtype)))
    errors["one value"] = _error(lambda: SyncBatchNorm(4)(torch.randn(1 if rank == 0 else 0, 4)))
    y = SyncBatchNorm(2)(torch.tensor([[1.0, 2.0], [3.0, 6.0]]) + rank)  # the group still works
    return errors, bool(torch.isfinite(y).all())


def _recalibrated(rank, chunks):
    """normlab.recalibrate_batch_norm on a SyncBatchNorm model, each rank with its own chunk (one
    batch each; rank 1's is empty): the running statistics of the pooled population."""
    import normlab

    model = torch.nn.Sequential(normlab.nn.SyncBatchNorm(4).double())
    normlab.recalibrate_batch_norm(model, [chunks[rank]], progress=False)
    bn = model[0]
    return bn.running_mean.clone(), bn.running_var.clone()


def _moments(rank, chunks):
    """Recalibration's pooling: this rank's (count, mean, M2) over its chunks, merged across ranks."""
    from normlab.ops.batch_norm.sync import chan_merge, merge_moments

    mine = chunks[rank]
    count, mean, m2 = 0, None, None
    if mine.shape[0]:
        count, mean = mine.shape[0], mine.mean(0)
        m2 = ((mine - mean) ** 2).sum(0)
    merged = merge_moments(count, mean, m2, mine.shape[1])
    assert chan_merge([0, 0], [torch.zeros(2)] * 2, [torch.zeros(2)] * 2)[0] == 0
    return merged


def world_3_worker(rank, world, cases, subset_case, members, moment_chunks):
    out = {"moments": _moments(rank, moment_chunks), "recalibrated": _recalibrated(rank, moment_chunks)}
    out["cases"] = [run_case(rank, case) for case in cases]
    out["subset"] = _subset(rank, subset_case, members)
    out["errors"], out["after_errors"] = _disagreements(rank)
    return out


def gpu_worker(rank, world, cases):
    """The cases on ``cuda:<rank>`` (NCCL): the reference backend's path."""
    return [run_case(rank, case, device=f"cuda:{rank}") for case in cases]
