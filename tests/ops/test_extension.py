"""The C++ extension's install and load checks: torch version, CPU level, pure-Python install,
no compiler. Each runs what a user would run and reads the message they would see."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from normlab.ops import extension

ROOT = Path(__file__).resolve().parents[2]
HAS_SOURCE = (ROOT / "setup.py").exists() and (ROOT / "src" / "normlab").is_dir()


def test_a_library_built_for_another_torch_is_refused_with_both_versions_and_the_fix():
    info = {"torch": "2.4.0", "level": "v3", "cpu_flags": []}
    with pytest.raises(ImportError) as e:
        extension.check(info, "2.13.0", set())
    msg = str(e.value)
    assert "2.4.0" in msg and "2.13.0" in msg and "pip install --no-build-isolation" in msg


def test_a_native_library_on_a_cpu_lacking_its_instructions_is_refused_naming_them():
    # NORMLAB_NATIVE=1: one copy for the build machine, its flags recorded
    info = {"torch": "2.13.0", "level": "native", "cpu_flags": ["avx2", "avx512f", "avx512bw"]}
    with pytest.raises(ImportError, match=r"native.*avx512bw, avx512f.*without NORMLAB_NATIVE=1"):
        extension.check(info, "2.13.0", {"avx2", "sse2"})
    extension.check(info, "2.13.0", {"avx2", "avx512f", "avx512bw", "sse2"})  # all there: loads
    extension.check(info, "2.13.0", None)  # flags unknown (not Linux): not refused


@pytest.mark.skipif(not extension.available(), reason="installed without the C++ extension")
def test_the_installed_library_matches_this_torch_and_this_cpu():
    info = extension.build_info()
    assert info["torch"] == torch.__version__
    assert info["level"] in ("dispatch", "native", "default")
    flags = extension._cpu_flags()
    if flags is not None:
        assert set(info["cpu_flags"]) <= flags


@pytest.mark.skipif(not HAS_SOURCE, reason="needs normlab's source tree (setup.py)")
def test_no_compiler_is_met_with_a_message_naming_the_fix(tmp_path):
    env = {**os.environ, "CXX": str(tmp_path / "no-such-c++")}
    env.pop("NORMLAB_NO_EXTENSION", None)
    r = subprocess.run([sys.executable, "setup.py", "build_ext", "--build-temp", str(tmp_path / "t"),
                        "--build-lib", str(tmp_path / "l")], cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 1
    assert "no C++ compiler found" in r.stderr and "NORMLAB_NO_EXTENSION=1" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "l").exists()  # refused before any work


_PURE_CHECK = r"""
import torch, normlab
x = torch.randn(4, 6)
assert normlab.backend_for(x, "layer_norm") == "ref", normlab.backend_for(x, "layer_norm")
try:
    normlab.set_backend("cpu")
except ValueError as e:
    assert "NORMLAB_NO_EXTENSION" in str(e) and "normlab._C" in str(e), e
else:
    raise AssertionError("'cpu' accepted without the extension")
ln, ref = normlab.nn.LayerNorm(6), torch.nn.LayerNorm(6)
torch.testing.assert_close(ln(x), ref(x))
print("pure ok")
"""


@pytest.mark.skipif(not HAS_SOURCE, reason="needs normlab's source tree (setup.py)")
def test_pure_python_install_takes_ref_and_refuses_cpu_clearly(tmp_path):
    src = tmp_path / "src-copy"  # a copy, so that no library built earlier is picked up
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("_C*.so", "_C_build.json",
                                                                              "__pycache__"))
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    target = tmp_path / "site"
    env = {**os.environ, "NORMLAB_NO_EXTENSION": "1"}
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--target", str(target), str(src)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not list(target.glob("normlab/_C*"))
    env = {k: v for k, v in os.environ.items() if k not in ("NORMLAB_BACKEND", "NORMLAB_NO_EXTENSION")}
    env["PYTHONPATH"] = str(target)
    r = subprocess.run([sys.executable, "-c", _PURE_CHECK], env=env, capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 0 and "pure ok" in r.stdout, r.stderr[-3000:]
