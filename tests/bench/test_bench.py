"""normlab bench: byte accounting, that every provider measures the right computation,
and the files of a run (written, interrupted, resumed). No timed assertions."""

from __future__ import annotations

import argparse
import os

import pytest
import torch
import torch.nn.functional as F

import normlab
import normlab.functional as NF
from normlab.bench import add_bench_parser, main_bench, render, run, run_bench
from normlab.bench.cases import MIN_TRAFFIC, MODES, OPS, Case, min_bytes, num_groups, traffic
from normlab.bench.setups import make_setup
from normlab.bench.report import KEY_FIELDS
from tests.bench.files import csv_rows, json_rows

MiB = 1 << 20


# --------------------------------------------------------------------------
# Byte accounting: hand-computed
# --------------------------------------------------------------------------

@pytest.mark.parametrize("op, mode, shape, dtype, expected", [
    # layer_norm (4096, 1024) float32: x is 16 MiB; forward 1R+1W, backward 2R+1W, both 3R+2W
    ("layer_norm", "forward", (4096, 1024), "float32", 2 * 16 * MiB),
    ("layer_norm", "backward", (4096, 1024), "float32", 3 * 16 * MiB),
    ("layer_norm", "forward+backward", (4096, 1024), "float32", 5 * 16 * MiB),
    # rms_norm (65536, 256) bfloat16: x is 32 MiB
    ("rms_norm", "forward", (65536, 256), "bfloat16", 2 * 32 * MiB),
    ("rms_norm", "backward", (65536, 256), "bfloat16", 3 * 32 * MiB),
    # add_layer_norm 4x6 float32: x is 96 B; forward reads x, r writes y, h; backward reads h, dy, dh writes dx
    ("add_layer_norm", "forward", (4, 6), "float32", 4 * 96),
    ("add_layer_norm", "backward", (4, 6), "float32", 4 * 96),
    ("add_layer_norm", "forward+backward", (4, 6), "float32", 8 * 96),
    # add_rms_norm (8192, 4096) bfloat16: x is 64 MiB
    ("add_rms_norm", "forward", (8192, 4096), "bfloat16", 4 * 64 * MiB),
    ("add_rms_norm", "forward+backward", (8192, 4096), "bfloat16", 8 * 64 * MiB),
    # batch_norm (32, 64, 32, 32) float32: 2 Mi values, 8 MiB
    ("batch_norm_train", "forward", (32, 64, 32, 32), "float32", 2 * 8 * MiB),
    ("batch_norm_train", "backward", (32, 64, 32, 32), "float32", 3 * 8 * MiB),
    ("batch_norm_train", "forward+backward", (32, 64, 32, 32), "float32", 5 * 8 * MiB),
    ("batch_norm_eval", "forward", (256, 256, 8, 8), "bfloat16", 2 * 8 * MiB),
    ("batch_norm_eval", "backward", (256, 256, 8, 8), "bfloat16", 3 * 8 * MiB),  # dw needs x
    # group_norm (32, 64, 32, 32) bfloat16: 4 MiB
    ("group_norm", "forward", (32, 64, 32, 32), "bfloat16", 2 * 4 * MiB),
    ("group_norm", "forward+backward", (32, 64, 32, 32), "bfloat16", 5 * 4 * MiB),
])
def test_min_bytes_hand_computed(op, mode, shape, dtype, expected):
    assert min_bytes(op, mode, shape, dtype) == expected


def test_traffic_table_covers_every_op_and_mode():
    assert set(MIN_TRAFFIC) == set(OPS)
    for op in OPS:
        (rf, wf), (rb, wb) = traffic(op, "forward"), traffic(op, "backward")
        assert traffic(op, "forward+backward") == (rf + rb, wf + wb)
        assert all(traffic(op, m)[0] >= 1 and traffic(op, m)[1] >= 1 for m in MODES)


def test_layer_norm2d_cases_in_both_layouts_and_never_2d():
    from normlab.bench.cases import cases_for

    cases = cases_for("layer_norm2d", "float32", shapes=[(4, 6), (2, 3, 5), (2, 3, 4, 5)])
    assert [(c.shape, c.layout) for c in cases] == [
        ((2, 3, 5), "contiguous"), ((2, 3, 4, 5), "contiguous"), ((2, 3, 4, 5), "channels_last")]
    defaults = cases_for("layer_norm2d", "bfloat16")
    assert {c.layout for c in defaults} == {"contiguous", "channels_last"}
    assert max(c.x_bytes for c in defaults) >= 32 * MiB  # 64 MB in float32: out of cache


TINY = {"rows": (5, 24), "nchw": (3, 8, 2, 3)}


def _tiny_cases(dtype):
    out = []
    for op in OPS:
        if op.startswith("batch_norm"):
            out += [Case(op, TINY["nchw"], dtype), Case(op, TINY["nchw"], dtype, "channels_last"),
                    Case(op, (6, 8), dtype)]
        elif op == "group_norm":
            out.append(Case(op, TINY["nchw"], dtype))
        elif op == "layer_norm2d":
            out += [Case(op, TINY["nchw"], dtype), Case(op, TINY["nchw"], dtype, "channels_last")]
        else:
            out.append(Case(op, TINY["rows"], dtype))
    return out


@pytest.mark.parametrize("case", _tiny_cases("float32"), ids=lambda c: c.label())
def test_limit_copies_have_the_op_allocation_pattern(case):
    setup = make_setup(case, providers=("limit",))
    assert setup.min_bytes("forward") == min_bytes(case.op, "forward", case.shape, case.dtype)
    x = setup.fwd_pool[0]
    for mode in MODES:
        cand = setup.candidate("limit", mode)
        with cand.context():
            out = cand.prepare()()
        outs = out if isinstance(out, tuple) else (out,)
        # fwd+bwd returns the backward piece's outputs
        writes = traffic(case.op, "backward" if mode == "forward+backward" else mode)[1]
        assert len(outs) == writes
        for t in outs:
            assert t.shape == x.shape and t.dtype == x.dtype and t.grad_fn is None
            if case.layout == "channels_last":
                assert t.is_contiguous(memory_format=torch.channels_last)
            assert all(t.data_ptr() != p.data_ptr() for p in (*setup.fwd_pool, *setup.bwd_pool))


# --------------------------------------------------------------------------
# Every provider computes what torch eager computes
# --------------------------------------------------------------------------

def _torch_reference(setup):
    """Forward outputs and gradients written out here, independently of cases.py."""
    op = setup.case.op
    ins = [t.detach().clone().requires_grad_(True) for t in setup.grad_inputs]
    if op == "layer_norm":
        x, w, b = ins
        outs = (F.layer_norm(x, (x.shape[-1],), w, b, 1e-5),)
    elif op == "rms_norm":
        x, w = ins
        outs = (F.rms_norm(x, (x.shape[-1],), w, 1e-6),)
    elif op == "add_layer_norm":
        x, r, w, b = ins
        h = x + r
        outs = (F.layer_norm(h, (h.shape[-1],), w, b, 1e-5), h)
    elif op == "add_rms_norm":
        x, r, w = ins
        h = x + r
        outs = (F.rms_norm(h, (h.shape[-1],), w, 1e-6), h)
    elif op.startswith("batch_norm"):
        x, w, b = ins
        rm, rv = setup.args_for("reference")[3:]  # fresh copies of the running statistics
        outs = (F.batch_norm(x, rm, rv, w, b, op == "batch_norm_train", 0.1, 1e-5),)
    elif op == "layer_norm2d":
        x, w, b = ins
        outs = (F.layer_norm(x.permute(0, 2, 3, 1), (x.shape[1],), w, b, 1e-6).permute(0, 3, 1, 2),)
    else:
        x, w, b = ins
        outs = (F.group_norm(x, num_groups(x.shape[1]), w, b, 1e-5),)
    grads = torch.autograd.grad(outs, ins, setup.grad_outputs)
    return outs, grads


def _run(setup, provider, mode):
    cand = setup.candidate(provider, mode)
    with cand.context():
        out = cand.prepare()()
    return out if isinstance(out, tuple) else (out,)


def _check_providers(case, providers, atol, rtol, compile_backend="aot_eager"):
    torch._dynamo.reset()
    setup = make_setup(case, providers=providers, compile_backend=compile_backend)
    ref_out, ref_grads = _torch_reference(setup)
    measured = [p for p in providers if p not in setup.unavailable]
    assert "normlab-ref" in measured or "normlab-ref" not in providers
    for provider in measured:
        for mode in MODES:
            got = _run(setup, provider, mode)
            want = ref_out if mode == "forward" else ref_grads
            assert len(got) == len(want), (provider, mode)
            for i, (g, w) in enumerate(zip(got, want)):
                where = f"{case.label()} {provider} {mode} output {i}"
                torch.testing.assert_close(g.float(), w.float(), atol=atol, rtol=rtol,
                                           msg=lambda m, where=where: f"{where}: {m}")
    for provider, why in setup.unavailable.items():
        assert why, provider


@pytest.mark.parametrize("case", _tiny_cases("float32"), ids=lambda c: c.label())
def test_providers_compute_torch_eager_result_float32(case):
    # the compile provider is checked with the "eager" dynamo backend: the same traced
    # function and arguments, without minutes of C++ compilation in the test suite
    _check_providers(case, ("normlab-cpu", "normlab-ref", "torch", "compile"), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case", [c for c in _tiny_cases("bfloat16") if c.layout == "contiguous"],
                         ids=lambda c: c.label())
def test_providers_compute_torch_eager_result_bfloat16(case):
    # a few bfloat16 ulps: normlab rounds once from float32, torch eager may round in between
    _check_providers(case, ("normlab-cpu", "normlab-ref", "torch"), atol=6e-2, rtol=3e-2)


# --------------------------------------------------------------------------
# Runs: files, n/a providers, interrupt and resume
# --------------------------------------------------------------------------

FAST = {"repeats": 1, "warmup": 0, "min_sample_ms": 0.05, "dtypes": "float32", "threads": "1",
        "progress": False}


def _keys(rows):
    return [tuple(str(r[k]) for k in KEY_FIELDS) for r in rows]


def test_quick_like_run_writes_csv_json_png(tmp_path):
    out = str(tmp_path / "bench")
    result = run_bench(ops="layer_norm,add_rms_norm,batch_norm_train", sizes="4x6,1x6x2x2",
                       providers="normlab-cpu,normlab-ref,torch,compile,limit", compile_backend="eager",
                       out=out, **FAST)
    # layer_norm, add_rms_norm: 4x6 only (2-D); batch_norm_train: 4x6, 1x6x2x2 in two layouts
    n_groups = (1 + 1 + 3) * len(MODES)
    assert result["measured"] == n_groups and not result["interrupted"]
    rows = json_rows(result["files"]["json"])
    assert len(rows) == n_groups * 5 == len(csv_rows(result["files"]["csv"]))
    assert len(set(_keys(rows))) == len(rows)
    for r in rows:
        if r["provider"] == "normlab-cpu":
            assert r["status"] in ("ok", "n/a") and (r["status"] == "ok" or r["reason"])
        else:
            assert r["status"] == "ok", r
            assert r["median_s"] > 0 and r["gbps"] > 0 and r["first_call_s"] > 0
            assert r["bytes"] == min_bytes(r["op"], r["mode"], [int(s) for s in r["shape"].split("x")], "float32")
        if r["provider"] == "torch":
            assert r["vs_torch"] == pytest.approx(1.0)
        if r["provider"] == "limit":
            assert r["of_limit"] == pytest.approx(1.0)
    assert result["files"]["png"] == [os.path.join(out, "gbps_float32_t1.png")]
    with open(result["files"]["png"][0], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    text = render(result)
    assert "layer_norm" in text and "channels_last" in text and "files:" in text


def test_interrupted_then_resumed_run_has_no_duplicate_rows(tmp_path):
    out = str(tmp_path / "bench")
    opts = dict(ops="layer_norm,group_norm", sizes="4x6,1x6x2x2", providers="normlab-ref,torch,limit",
                out=out, **FAST)
    n_groups = 3 * len(MODES)  # layer_norm 4x6; group_norm 4x6 and 1x6x2x2

    seen = []

    def interrupt_after_two(rows):
        seen.append(rows)
        if len(seen) == 2:
            raise KeyboardInterrupt

    first = run_bench(on_group=interrupt_after_two, **opts)
    assert first["interrupted"] and first["measured"] == 2
    assert len(json_rows(first["files"]["json"])) == 2 * 3
    assert len(csv_rows(first["files"]["csv"])) == 2 * 3

    second = run_bench(resume=True, **opts)
    assert not second["interrupted"]
    assert second["skipped"] == 2 and second["measured"] == n_groups - 2
    rows = json_rows(second["files"]["json"])
    assert len(rows) == n_groups * 3 and len(set(_keys(rows))) == len(rows)
    csv_keys = _keys(csv_rows(second["files"]["csv"]))
    assert len(csv_keys) == len(set(csv_keys)) == n_groups * 3

    # resuming a finished run measures nothing; from the CSV alone as well
    os.remove(second["files"]["json"])
    third = run_bench(resume=True, **opts)
    assert third["measured"] == 0 and third["skipped"] == n_groups
    assert len(json_rows(third["files"]["json"])) == n_groups * 3

    # a run without --resume starts afresh
    fresh = run_bench(**{**opts, "ops": "layer_norm"})
    assert len(fresh["rows"]) == len(MODES) * 3


def test_missing_or_unimplemented_provider_is_na_not_a_crash(tmp_path, monkeypatch):
    def not_yet(*args, **kwargs):
        raise NotImplementedError("add_layer_norm: kernel not written yet")

    monkeypatch.setattr(NF, "add_layer_norm", not_yet)
    monkeypatch.delattr(NF, "add_rms_norm")
    monkeypatch.setattr(normlab._backend, "_BACKENDS", ("ref",))  # an install without the extension
    result = run_bench(ops="add_layer_norm,add_rms_norm", sizes="4x6", modes="forward,backward",
                       providers="normlab-cpu,normlab-ref,torch", out=str(tmp_path), **FAST)
    by = {(r["op"], r["mode"], r["provider"]): r for r in result["rows"]}
    assert len(by) == 2 * 2 * 3
    for mode in ("forward", "backward"):
        assert by[("add_layer_norm", mode, "normlab-ref")]["status"] == "n/a"
        assert "not written yet" in by[("add_layer_norm", mode, "normlab-ref")]["reason"]
        assert "does not exist" in by[("add_rms_norm", mode, "normlab-ref")]["reason"]
        for op in ("add_layer_norm", "add_rms_norm"):
            assert "not registered" in by[(op, mode, "normlab-cpu")]["reason"]
            assert by[(op, mode, "torch")]["status"] == "ok"
    assert "n/a" in render(result)


def test_cli_parser_and_main(tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="normlab")
    add_bench_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--ops", "rms_norm", "--sizes", "4x6", "--modes", "forward",
                              "--providers", "torch,limit", "--dtypes", "float32", "--threads", "1",
                              "--repeats", "1", "--warmup", "0", "--out", str(tmp_path)])
    assert args.func is main_bench
    assert main_bench(args) == 0
    printed = capsys.readouterr().out
    assert "rms_norm" in printed and "bench.csv" in printed
    with pytest.raises(ValueError, match="unknown op 'layernorm'"):
        run(ops="layernorm", out=str(tmp_path))
