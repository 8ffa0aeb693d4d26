"""normlab.nn.SyncBatchNorm on real gloo groups of 2 and 3 processes.

The oracle runs here, in float64: torch.nn.BatchNorm on the concatenation of
the ranks' batches (cases: ``sync_cases.py``; what the ranks run: ``sync_workers.py``).
Outputs, input gradients, weight/bias gradients summed over the ranks and the
running statistics of every rank must match it: within 1e-10 in float64,
1e-5 in float32 (bfloat16: a few of its roundings); the running statistics must
be the same bits on every rank.
"""

from __future__ import annotations

import torch
from torch import nn

from .sync_cases import CASES_2, CASES_3, COMPILE_CASE, MOMENT_CHUNKS, SUBSET_CASE, mlp

ORACLE = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}
TOL = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=1e-5, atol=1e-5),
       torch.bfloat16: dict(rtol=3e-2, atol=3e-2)}  # bfloat16: a few of its roundings (2^-8 each)


def _oracle(case):
    x = case["x"].double().requires_grad_()
    m = ORACLE[x.dim()](case["c"], dtype=torch.float64, **case["kwargs"])
    with torch.no_grad():
        if m.weight is not None:
            m.weight.copy_(case["w"])
        if m.bias is not None:
            m.bias.copy_(case["b"])
    y = m(x)
    (y * case["dy"].double()).sum().backward()
    ref = dict(y=y.detach(), dx=x.grad, dw=m.weight.grad if m.weight is not None else None,
               db=m.bias.grad if m.bias is not None else None)
    m(case["x2"].double())
    ref.update(y_eval=m.eval()(case["x_eval"].double()), rm=m.running_mean, rv=m.running_var,
               nbt=m.num_batches_tracked)
    return ref


def _close(got, ref, dtype, what):
    if ref is None:
        assert got is None, what
        return
    assert got.dtype == dtype, f"{what}: dtype {got.dtype}, expected {dtype}"
    torch.testing.assert_close(got.double(), ref, **TOL[dtype], msg=lambda m: f"{what}: {m}")


def _check(case, outs, name):
    """``outs``: the results of the ranks holding ``case["sizes"]``, in that order."""
    ref, dtype = _oracle(case), case["dtype"]
    _close(torch.cat([o["y"] for o in outs]), ref["y"], dtype, f"{name}: output")
    _close(torch.cat([o["dx"] for o in outs]), ref["dx"], dtype, f"{name}: input gradient")
    for key in ("dw", "db"):  # local sums: the data-parallel wrapper adds (averages) them
        got = None if outs[0][key] is None else sum(o[key] for o in outs)
        _close(got, ref[key], dtype, f"{name}: {key} summed over ranks")
    _close(outs[0]["y_eval"], ref["y_eval"], dtype, f"{name}: evaluation output")
    for rank, o in enumerate(outs):
        if ref["rm"] is None:
            assert o["rm"] is None and o["rv"] is None and o["nbt"] is None
            continue
        assert int(o["nbt"]) == int(ref["nbt"]), f"{name}: num_batches_tracked"
        for key in ("rm", "rv"):
            _close(o[key], ref[key], dtype, f"{name}: {key} on rank {rank}")
            assert torch.equal(o[key], outs[0][key]), f"{name}: {key} differs between ranks 0 and {rank}"
    if case["layout"] == "channels_last" and case["x"].dim() == 4:
        assert all(o["y_channels_last"] for o, n in zip(outs, case["sizes"]) if n > 1), f"{name}: layout"


def test_world_size_2_equals_batch_norm_on_the_concatenated_batch(world_2):
    for i, name in enumerate(CASES_2):
        _check(CASES_2[name], [o["cases"][i] for o in world_2], name)


def test_world_size_3_equals_batch_norm_on_the_concatenated_batch(world_3):
    for i, name in enumerate(CASES_3):
        _check(CASES_3[name], [o["cases"][i] for o in world_3], name)


def test_a_subgroup_synchronises_its_members_only(world_3):
    _check(SUBSET_CASE, [world_3[0]["subset"], world_3[2]["subset"]], "group of ranks 0 and 2 in a world of 3")
    assert world_3[1]["subset"] is None  # rank 1 was refused with a clear error (checked on the rank)


def test_ranks_that_disagree_all_raise_a_clear_error(world_3):
    for rank, o in enumerate(world_3):
        errors = o["errors"]
        for what in ("channels", "dtype at the first call", "dtype later"):
            assert "disagree on this layer's input" in errors[what], (rank, what, errors[what])
        assert ("rank 0: 4 channels, float32; rank 1: 5 channels, float32; rank 2: 4 channels, float32"
                in errors["channels"]), errors["channels"]
        assert "rank 2: 4 channels, float64" in errors["dtype at the first call"], errors
        assert "rank 1: 4 channels, float64" in errors["dtype later"], errors
        assert "more than 1 value per channel" in errors["one value"] and "3 ranks" in errors["one value"], errors
        assert o["after_errors"] is True  # and the group still works


def test_torch_compile_fullgraph_traces_and_matches_the_concatenated_batch(world_2):
    sizes, x, dy = COMPILE_CASE
    model = mlp(nn.BatchNorm1d)
    for _ in range(2):
        y = model(x)
        (y * dy).sum().backward()
    got, tol = [o["compiled"] for o in world_2], TOL[torch.float64]
    torch.testing.assert_close(torch.cat([o["y"] for o in got]), y.detach(), **tol)
    for k, p in model.named_parameters():  # summed over ranks: what DistributedDataParallel averages
        torch.testing.assert_close(sum(o["grads"][k] for o in got), p.grad, **tol, msg=lambda m: f"{k}: {m}")
    for o in got:
        for k, v in model.named_buffers():
            torch.testing.assert_close(o["buffers"][k], v, **tol, msg=lambda m: f"{k}: {m}")


def test_a_silent_rank_makes_the_others_raise_after_the_timeout(world_2):
    from .sync_cases import FAULT_TIMEOUT_S

    message, waited = world_2[0]["faults"]["silent"]
    assert "normlab SyncBatchNorm: the all-reduce of the gradient sums failed on rank 0" in message, message
    assert "timeout=" in message  # says how to set it
    assert FAULT_TIMEOUT_S - 0.5 < waited < FAULT_TIMEOUT_S + 5, waited


def test_a_crashed_rank_makes_the_others_raise_at_once(world_2):
    message, waited = world_2[0]["faults"]["crash"]
    assert "normlab SyncBatchNorm: the all-gather of the batch statistics failed on rank 0" in message, message
    assert waited < 5, waited


def test_recalibration_statistics_pool_across_ranks(world_3):
    everything = torch.cat(MOMENT_CHUNKS)  # the oracle: one population, two-pass float64
    for rank, o in enumerate(world_3):
        count, mean, m2 = o["moments"]
        assert count == everything.shape[0]
        torch.testing.assert_close(mean, everything.mean(0), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(m2 / (count - 1), everything.var(0), rtol=1e-12, atol=1e-12)
        assert torch.equal(mean, world_3[0]["moments"][1]) and torch.equal(m2, world_3[0]["moments"][2])


def test_recalibrate_batch_norm_pools_sync_batch_norm_across_ranks(world_3):
    """normlab.recalibrate_batch_norm on a SyncBatchNorm model: every rank ends with the mean and
    unbiased variance of all ranks' samples together (rank 1 had none)."""
    everything = torch.cat(MOMENT_CHUNKS)
    for rank, o in enumerate(world_3):
        mean, var = o["recalibrated"]
        torch.testing.assert_close(mean, everything.mean(0), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(var, everything.var(0), rtol=1e-12, atol=1e-12)
