"""normlab bench --suite blocks: rows, columns, files, and the converted block's numbers. No timed assertions."""

from __future__ import annotations

import pytest
import torch

from normlab.bench import blocks, render, run
from normlab.bench.blocks import LAYERS, build_modules, cases
from tests.bench.files import csv_rows, json_rows

FAST = {"repeats": 1, "warmup": 0, "min_sample_ms": 0.05, "threads": "1", "progress": False}


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(blocks, "BLOCK_SIZES", (((64, 4), (2, 16, 64)),) * 2)
    monkeypatch.setattr(blocks, "LN2D_SHAPE", (2, 8, 4, 4))


def test_quick_suite_rows_and_columns(tmp_path, tiny):
    out = str(tmp_path / "b")
    result = blocks.run_blocks(layers="LlamaBlock,LayerNorm2d", quick=True, out=out, **FAST)
    # dtypes float32, bfloat16 x (block fwd+bwd + LayerNorm2d NCHW/cl x fwd, fwd+bwd) = 2 x 5
    assert result["suite"] == "blocks" and result["measured"] == 10 and not result["interrupted"]
    rows = result["rows"]
    assert {(r["name"], r["layout"], r["mode"]) for r in rows} == {
        ("LlamaBlock", "contiguous", "fwd+bwd"),
        *((n, lay, m) for n in ("LayerNorm2d",) for lay in ("contiguous", "channels_last") for m in ("fwd", "fwd+bwd"))}
    assert {r["dtype"] for r in rows} == {"float32", "bfloat16"}
    for r in rows:
        assert r["status"] == "ok", r
        assert r["torch_us"] > 0 and r["normlab_us"] > 0 and r["repeats"] == 1
        assert r["x_torch"] == pytest.approx(r["torch_us"] / r["normlab_us"], rel=1e-9)
        assert r["max_abs_diff"] < (1e-4 if r["dtype"] == "float32" else 0.1), r
    for got in (json_rows(result["files"]["json"]), csv_rows(result["files"]["csv"])):
        assert len(got) == 10 and {"x_torch", "torch_us", "normlab_us", "max_abs_diff"} <= set(got[0])
    text = render(result)  # normlab.bench.render dispatches on the suite
    for word in ("LlamaBlock(64, 4)", "LayerNorm2d(8)", "2x8x4x4 cl", "×torch", "max Δy", "blocks.csv"):
        assert word in text
    # the CLI entry: --suite blocks --ops selects a layer; --resume skips what is there
    again = run(suite="blocks", ops="layernorm2d", quick=True, resume=True, out=out, dtypes="float32",
                repeats=1, warmup=0, threads="1")
    assert again["measured"] == 0 and again["skipped"] == 4


def test_converted_block_equals_torch_float32():
    case = cases(quick=True)[0][0]
    assert case.name == LAYERS[0]
    mods = build_modules(case, torch.float32, torch.Generator().manual_seed(0))
    assert type(mods["normlab"].attn_norm).__module__.startswith("normlab")
    x = torch.randn(case.shape, generator=torch.Generator().manual_seed(1))
    dy = torch.randn(case.shape, generator=torch.Generator().manual_seed(2))
    ys, grads = {}, {}
    for p, m in mods.items():
        leaf = x.clone().requires_grad_(True)
        ys[p] = m(leaf)
        ys[p].backward(dy)
        grads[p] = [leaf.grad, *(q.grad for q in m.parameters())]
    torch.testing.assert_close(ys["normlab"], ys["torch"], rtol=1e-5, atol=1e-5)
    for g_n, g_t in zip(grads["normlab"], grads["torch"]):  # summation order differs: 1e-5 of the scale
        torch.testing.assert_close(g_n, g_t, rtol=1e-5, atol=1e-5 * g_t.abs().max().item())


def test_generate_rows_give_the_same_tokens_with_and_without_convert(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from normlab.bench import hf_models

    monkeypatch.setattr(hf_models, "GENERATE_TOKENS", 6)
    monkeypatch.setattr(blocks, "GENERATE_SIZES", ((64, 1), (64, 1)))
    result = blocks.run_blocks(layers="GPT2Generate,LlamaGenerate", dtypes="float32", quick=True,
                               out=str(tmp_path / "g"), **FAST)
    rows = result["rows"]
    assert {(r["name"], r["mode"]) for r in rows} == {("GPT2Generate", "generate"), ("LlamaGenerate", "generate")}
    for r in rows:
        assert r["status"] == "ok" and r["max_abs_diff"] == 0, r  # the same tokens, one by one


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("name", blocks.CNN_BLOCKS)
def test_cnn_blocks_convert_to_the_fused_layers_and_agree(name, layout):
    """The convolutional blocks after normlab.convert (of a deep copy) hold normlab's norm layers
    (BatchNormAct2d, LayerNorm2d) with the same state_dict, and give torch's output in eval
    (float64: to float64 rounding)."""
    case = next(c for c, _ in cases(quick=True) if c.name == name and c.layout == layout)
    mods = build_modules(case, torch.float64, torch.Generator().manual_seed(0))
    t, n = mods["torch"], mods["normlab"]
    assert not t.training and not n.training
    norms = [m for m in n.modules() if "Norm" in type(m).__name__]
    assert norms and all(type(m).__module__ == "normlab.nn.norm_act" or type(m).__module__ == "normlab.nn.layer_norm"
                         for m in norms), [type(m) for m in norms]
    st, sn = t.state_dict(), n.state_dict()
    assert list(st) == list(sn) and all(torch.equal(st[k], sn[k]) for k in st)
    x = torch.randn(case.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        yt, yn = t(x), n(x)
    torch.testing.assert_close(yn, yt, rtol=1e-12, atol=1e-12)


def test_cnn_block_rows(tmp_path):
    result = blocks.run_blocks(layers="MBConv,ConvNeXtBlock", dtypes="float32", quick=True, out=str(tmp_path / "c"),
                               **FAST)
    rows = result["rows"]
    assert {(r["name"], r["layout"], r["mode"]) for r in rows} == {
        (n, lay, "fwd") for n in ("MBConv", "ConvNeXtBlock") for lay in ("contiguous", "channels_last")}
    for r in rows:
        assert r["status"] == "ok" and r["max_abs_diff"] < 1e-4, r
    assert "MBConv(16)" in render(result)
