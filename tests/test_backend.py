"""Backend choice: set_backend, use_backend, NORMLAB_BACKEND, and errors that list what exists."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import normlab
import normlab.functional as NF
from normlab import _backend


@pytest.fixture(autouse=True)
def _restore_global_choice():
    before = _backend._global_choice
    yield
    _backend._global_choice = before


def test_unknown_backend_lists_the_available_ones():
    with pytest.raises(ValueError, match=r"'triton'.*\['auto', 'ref'"):
        normlab.set_backend("triton")
    with pytest.raises(ValueError, match="expected one of"):
        with normlab.use_backend("fast"):
            pass


def test_use_backend_nests_and_restores():
    normlab.set_backend("auto")
    assert normlab.get_backend() == "auto"
    with normlab.use_backend("ref"):
        assert normlab.get_backend() == "ref"
        with normlab.use_backend("auto"):
            assert normlab.get_backend() == "auto"
        assert normlab.get_backend() == "ref"
    assert normlab.get_backend() == "auto"
    with pytest.raises(KeyError):
        with normlab.use_backend("ref"):
            raise KeyError("boom")
    assert normlab.get_backend() == "auto"


def test_set_backend_is_process_wide_and_context_wins():
    normlab.set_backend("ref")
    assert normlab.get_backend() == "ref"
    with normlab.use_backend("auto"):
        assert normlab.get_backend() == "auto"
    assert normlab.get_backend() == "ref"


def test_auto_picks_a_backend_that_serves_the_tensor():
    x = torch.randn(2, 3)
    name = _backend.resolve(x, "layer_norm")
    assert name in normlab.available_backends()
    # a tensor no fast backend serves falls back to the reference
    meta = torch.randn(2, 3, device="meta")
    assert _backend.resolve(meta, "layer_norm") == "ref"


def test_explicit_backend_that_cannot_serve_raises_and_lists_alternatives():
    if "cpu" not in normlab.available_backends():
        pytest.skip("no cpu backend registered (numba missing)")
    meta = torch.randn(2, 3, device="meta")
    with normlab.use_backend("cpu"):
        with pytest.raises(RuntimeError, match=r"backend 'cpu' cannot serve.*meta.*\['ref'\]"):
            NF.layer_norm(meta, (3,))


def test_results_agree_across_backends():
    x = torch.randn(8, 16, dtype=torch.float64)
    outs = {}
    for name in normlab.available_backends():
        with normlab.use_backend(name):
            outs[name] = NF.layer_norm(x, (16,))
    ref = torch.nn.functional.layer_norm(x, (16,))
    for name, y in outs.items():
        torch.testing.assert_close(y, ref, msg=name)


def _env_backend(value: str) -> subprocess.CompletedProcess:
    code = "import normlab; print(normlab.get_backend())"
    env = dict(os.environ, NORMLAB_BACKEND=value)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


def test_environment_variable_sets_the_default():
    out = _env_backend("ref")
    assert out.returncode == 0 and out.stdout.strip() == "ref"


def test_environment_variable_with_a_bad_name_fails_clearly():
    out = _env_backend("gpu-magic")
    assert out.returncode != 0 and "unknown backend 'gpu-magic'" in out.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_reference_backend_serves_cuda_tensors():
    x = torch.randn(4, 8, 6, device="cuda")
    with normlab.use_backend("auto"):
        torch.testing.assert_close(NF.layer_norm(x, (6,)), torch.nn.functional.layer_norm(x, (6,)))
        torch.testing.assert_close(NF.group_norm(x, 2), torch.nn.functional.group_norm(x, 2))
