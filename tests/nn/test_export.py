"""Deployment paths of a converted model: torch.export, torch.jit.trace and ONNX (run by ONNX Runtime).

Oracle: the model's own eval-mode outputs in eager mode (and torch.nn's, before conversion).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import normlab


def _model():
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.GroupNorm(2, 8), torch.nn.InstanceNorm2d(8, affine=True, track_running_stats=True),
        torch.nn.Flatten(1), torch.nn.LayerNorm(8 * 6 * 6), torch.nn.RMSNorm(8 * 6 * 6),
        torch.nn.Linear(8 * 6 * 6, 4), torch.nn.BatchNorm1d(4),
    )
    m.train()
    for _ in range(3):
        m(torch.randn(5, 3, 6, 6))  # running statistics away from 0 and 1
    return m.eval()


def _inputs():
    return (torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1)),)


def test_torch_export_runs_the_converted_model():
    torch_model = _model()
    model = normlab.convert(_model())
    (x,) = _inputs()
    want = model(x)
    torch.testing.assert_close(want, torch_model(x), rtol=1e-5, atol=1e-5)
    ep = torch.export.export(model, (x,))
    torch.testing.assert_close(ep.module()(x), want, rtol=1e-5, atol=1e-5)
    x2 = torch.randn(4, 3, 6, 6)
    torch.testing.assert_close(torch.export.export(model, (x2,)).module()(x2), model(x2), rtol=1e-5, atol=1e-5)


def test_jit_trace_records_the_norms():
    """A trace sees only aten ops: a kernel call would be missing from it, so tracing takes the
    reference math (checked on an input the trace did not see)."""
    model = normlab.convert(_model())
    (x,) = _inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model, (x,))
    x2 = torch.randn(2, 3, 6, 6) * 3 + 1
    torch.testing.assert_close(traced(x2), model(x2), rtol=1e-5, atol=1e-5)


def test_onnx_export_runs_in_onnx_runtime(tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    model = normlab.convert(_model())
    (x,) = _inputs()
    want = model(x).detach().numpy()
    path = tmp_path / "model.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, (x,), dynamo=True, verbose=False)
    program.save(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    assert got.shape == want.shape
    assert abs(got - want).max() <= 1e-5 * max(1.0, abs(want).max())


@pytest.mark.parametrize("make", [
    lambda: normlab.nn.LayerNorm(8), lambda: normlab.nn.RMSNorm(8), lambda: normlab.nn.LayerNorm2d(8),
    lambda: normlab.nn.BatchNorm1d(8), lambda: normlab.nn.GroupNorm(2, 8), lambda: normlab.nn.InstanceNorm2d(8),
    lambda: normlab.nn.FrozenBatchNorm2d(8),
    lambda: torch.nn.Sequential(torch.nn.Linear(4, 8), normlab.nn.BatchNorm1d(8)),  # as a submodule too
], ids=["LayerNorm", "RMSNorm", "LayerNorm2d", "BatchNorm1d", "GroupNorm", "InstanceNorm2d", "FrozenBatchNorm2d",
        "in_Sequential"])
def test_torch_jit_script_says_what_to_use_instead(make):
    """TorchScript cannot compile normlab's layers: the error names the layer and the way that
    works (revert a copy to torch.nn's layers), before TorchScript's compiler runs."""
    with pytest.raises(RuntimeError, match=r"normlab\.nn\.\w+ cannot be compiled by torch\.jit\.script.*normlab\.revert"):
        torch.jit.script(make())
