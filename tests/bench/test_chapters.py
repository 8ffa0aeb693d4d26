"""normlab bench --suite chapters: rows, files, the training loop, arguments. No timed assertions."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

import normlab
from normlab import cli
from normlab.bench import add_bench_parser, main_bench, render, run
from normlab.bench.chapters import (CASES, KEY_FIELDS, LOOP_MODE, MODES, chapter_mlp,
                                    layer_candidates, moons, run_chapters, train)
from tests.bench.files import csv_rows, json_rows

FAST = {"repeats": 1, "warmup": 0, "min_sample_ms": 0.05, "threads": "1", "progress": False}


def _check_times(r):
    assert r["status"] == "ok", r
    assert r["torch_us"] > 0 and r["normlab_us"] > 0
    assert r["x_torch"] == pytest.approx(r["torch_us"] / r["normlab_us"], rel=1e-9)
    assert r["torch_first_call_s"] > 0 and r["normlab_first_call_s"] > 0
    assert r["repeats"] == 1


def test_subset_rows_and_files(tmp_path):
    out = str(tmp_path / "b")
    result = run_chapters(layers="LayerNorm,add_rms_norm", dtypes="float32", out=out, **FAST)
    # LayerNorm(6) 4x6, LayerNorm(512) 32x10x512, add_rms_norm on both: 4 cases x 3 modes
    assert result["suite"] == "chapters" and result["measured"] == 12 and not result["interrupted"]
    rows = result["rows"]
    assert {(r["layer"], r["shape"]) for r in rows} == {
        ("LayerNorm(6)", "4x6"), ("LayerNorm(512)", "32x10x512"),
        ("add_rms_norm(6)", "4x6"), ("add_rms_norm(512)", "32x10x512")}
    assert sorted({r["mode"] for r in rows}) == sorted(MODES)
    for r in rows:
        _check_times(r)
        assert r["torch_runs_per_s"] is None and r["dtype"] == "float32" and r["threads"] == 1
    for got in (json_rows(result["files"]["json"]), csv_rows(result["files"]["csv"])):
        assert len(got) == 12
        assert len({tuple(str(r[k]) for k in KEY_FIELDS) for r in got}) == 12
    for r in csv_rows(result["files"]["csv"]):
        assert float(r["x_torch"]) == pytest.approx(float(r["torch_us"]) / float(r["normlab_us"]), rel=1e-6)
    text = render(result)  # normlab.bench.render dispatches on the suite
    assert "LayerNorm(512)" in text and "eval fwd" in text
    assert "of 12 rows >= 1.0x; slowest module call" in text and "chapters.csv" in text
    slowest = min(rows, key=lambda r: r["x_torch"])
    assert f"call {slowest['x_torch']:.2f}x ({slowest['layer']} {slowest['shape']}" in result["summary"]


def test_every_case_runs_forward_backward(tmp_path):
    result = run_chapters(layers=sorted({c.name for c in CASES}), dtypes="float32", modes="fwd+bwd",
                          out=str(tmp_path), **FAST)
    assert len(result["rows"]) == len(CASES)
    for r in result["rows"]:
        _check_times(r)
    assert any(r["layout"] == "channels_last" for r in result["rows"])


def test_bfloat16_on_two_threads_and_threads_are_restored(tmp_path):
    before = torch.get_num_threads()
    result = run_chapters(layers="batchnorm2d,add_layer_norm", dtypes="bfloat16", modes="fwd+bwd,eval",
                          out=str(tmp_path), **{**FAST, "threads": "2"})
    assert torch.get_num_threads() == before
    assert len(result["rows"]) == (2 + 2) * 2  # BatchNorm2d in two layouts, add_layer_norm at 2 sizes
    for r in result["rows"]:
        _check_times(r)
        assert r["threads"] == 2 and r["dtype"] == "bfloat16"


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.label}-{'x'.join(map(str, c.shape))}-{c.layout}")
@pytest.mark.parametrize("mode", ["fwd", "eval fwd"])
def test_both_providers_compute_the_same(case, mode):
    cands = layer_candidates(case, "float32", mode)
    outs = {}
    for p, cand in cands.items():
        with cand.context():
            out = cand.prepare()()
        outs[p] = out if isinstance(out, tuple) else (out,)
    assert len(outs["torch"]) == len(outs["normlab"])
    y_torch, y_normlab = outs["torch"][0], outs["normlab"][0]
    assert (y_torch.grad_fn is None) == (y_normlab.grad_fn is None) == (mode == "eval fwd")
    for t, n in zip(outs["torch"], outs["normlab"]):  # y (and h for the fused adds)
        assert t.shape == n.shape == case.shape
        torch.testing.assert_close(n, t, atol=1e-5, rtol=1e-5)


def test_moons_and_model_shape():
    X, y, source = moons()
    assert X.shape == (300, 2) and X.dtype == torch.float32
    assert y.shape == (300,) and set(y.tolist()) == {0, 1}
    assert "sklearn" in source or "numpy" in source
    m = chapter_mlp("BatchNorm1d")
    kinds = [type(layer).__name__ for layer in m]
    assert kinds == ["Linear", "BatchNorm1d", "Tanh"] * 3 + ["Linear"]
    assert [layer.out_features for layer in m if isinstance(layer, torch.nn.Linear)] == [64, 64, 64, 2]
    # the seed makes the model the same each time
    assert torch.equal(chapter_mlp("BatchNorm1d")[0].weight, m[0].weight)


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the values do not depend on it; a loaded 2-core machine does
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("norm", ["BatchNorm1d", "LayerNorm"])
def test_training_loop_trains_and_normlab_matches_torch(norm, one_thread):
    X, y, _ = moons()
    conv = normlab.convert(chapter_mlp(norm))
    assert not any(type(m) is getattr(torch.nn, norm) for m in conv.modules())
    assert sum(type(m) is getattr(normlab.nn, norm) for m in conv.modules()) == 3
    a = train(chapter_mlp(norm), X, y, steps=30, lr=2.0, record=True)
    b = train(conv, X, y, steps=30, lr=2.0, record=True)
    assert len(a) == len(b) == 31
    assert abs(a[-1] - a[0]) > 0.05  # the parameters moved
    if norm == "BatchNorm1d":
        assert a[-1] < a[0] - 0.1  # it learns (the LayerNorm version diverges at lr=2.0)
    # float32: the same losses while the rounding differences are small. lr=2.0 makes the loop
    # chaotic (the loss jumps to ~10 and back; the Linear biases before BatchNorm have a zero
    # true gradient, so their updates are rounding noise), so after 30 steps float32 runs that
    # differ by 1e-7 in one step's gradients can end 1e-2 apart; float64 shows the 30 steps agree.
    assert b[:3] == pytest.approx(a[:3], abs=1e-4)
    a64 = train(chapter_mlp(norm).double(), X.double(), y, steps=30, lr=2.0, record=True)
    b64 = train(normlab.convert(chapter_mlp(norm).double()), X.double(), y, steps=30, lr=2.0, record=True)
    assert abs(a64[-1] - a64[0]) > 0.05
    assert b64 == pytest.approx(a64, abs=1e-6)
    assert train(chapter_mlp(norm), X, y, steps=2) is None


def test_loop_rows(tmp_path):
    result = run_chapters(layers="loop", dtypes="float32", out=str(tmp_path), **FAST)
    rows = result["rows"]
    assert [r["layer"] for r in rows] == ["MLP[2,64,64,64,2]+BatchNorm1d(64)", "MLP[2,64,64,64,2]+LayerNorm(64)"]
    for r in rows:
        _check_times(r)
        assert r["mode"] == LOOP_MODE and r["shape"] == "300x2" and r["data"]
        assert r["torch_runs_per_s"] == pytest.approx(1e6 / r["torch_us"])
        assert r["x_torch"] == pytest.approx(r["normlab_runs_per_s"] / r["torch_runs_per_s"])
    assert "training loop BatchNorm1d(64) t1 " in result["summary"]
    assert "module call" not in result["summary"]
    # no float32: no loop
    assert run_chapters(layers="loop", dtypes="bfloat16", out=str(tmp_path / "bf"), **FAST)["rows"] == []


def test_interrupted_then_resumed(tmp_path):
    opts = dict(layers="rmsnorm", dtypes="float32", out=str(tmp_path), **FAST)
    seen = []

    def stop_after_two(row):
        seen.append(row)
        if len(seen) == 2:
            raise KeyboardInterrupt

    first = run_chapters(on_group=stop_after_two, **opts)
    assert first["interrupted"] and first["measured"] == 2
    assert len(json_rows(first["files"]["json"])) == len(csv_rows(first["files"]["csv"])) == 2
    second = run_chapters(resume=True, **opts)
    assert second["skipped"] == 2 and second["measured"] == 4 and len(second["rows"]) == 6
    assert len({tuple(str(r[k]) for k in KEY_FIELDS) for r in second["rows"]}) == 6


def test_failures_are_rows_not_crashes(tmp_path, monkeypatch):
    import normlab.functional as NF

    def broken(*args, **kwargs):
        raise RuntimeError("cannot build")

    def not_yet(*args, **kwargs):
        raise NotImplementedError("not written yet")

    monkeypatch.setattr(normlab.nn, "RMSNorm", broken)
    monkeypatch.setattr(NF, "add_rms_norm", not_yet)
    result = run_chapters(layers="rmsnorm,add_rms_norm,layernorm", modes="fwd", dtypes="float32",
                          out=str(tmp_path), **FAST)
    by = {r["layer"]: r for r in result["rows"]}
    assert len(by) == 6
    for n in (6, 512):
        assert by[f"RMSNorm({n})"]["status"] == "error" and "cannot build" in by[f"RMSNorm({n})"]["reason"]
        fused = by[f"add_rms_norm({n})"]
        assert fused["status"] == "n/a" and "normlab: NotImplementedError: not written yet" in fused["reason"]
        assert fused["torch_us"] > 0 and fused["normlab_us"] is None and fused["x_torch"] is None
        _check_times(by[f"LayerNorm({n})"])
    assert " of 2 rows >= 1.0x" in result["summary"] and result["summary"].endswith("; 4 rows failed")
    assert "cannot build" in render(result)


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="unknown suite 'chapter'"):
        run(suite="chapter", out=str(tmp_path))
    with pytest.raises(ValueError, match="unknown layer 'layernrom'"):
        run(suite="chapters", ops="layernrom", out=str(tmp_path))
    with pytest.raises(ValueError, match="unknown mode 'backward'"):
        run_chapters(modes="backward", out=str(tmp_path))
    with pytest.raises(ValueError, match="unknown dtype 'float16'"):
        run_chapters(dtypes="float16", out=str(tmp_path))
    with pytest.raises(ValueError, match="--sizes is not used"):
        run(suite="chapters", sizes="4x6", out=str(tmp_path))
    with pytest.raises(SystemExit):  # argparse: invalid choice
        cli.build_parser().parse_args(["bench", "--suite", "nope"])


def test_cli(tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="normlab")
    add_bench_parser(parser.add_subparsers(dest="command"))
    common = ["--ops", "rmsnorm", "--modes", "forward,eval", "--dtypes", "float32", "--threads", "1",
              "--repeats", "1", "--warmup", "0", "--out", str(tmp_path)]
    assert main_bench(parser.parse_args(["bench", "--suite", "chapters", *common])) == 0
    printed = capsys.readouterr().out
    assert "RMSNorm(512)" in printed and "chapters.json" in printed and "of 4 rows" in printed
    assert cli.main(["bench", "--suite", "chapters", "--json", *common]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["suite"] == "chapters" and len(result["rows"]) == 4
    assert {r["mode"] for r in result["rows"]} == {"fwd", "eval fwd"}
