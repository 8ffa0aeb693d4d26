"""The kernels' x86-64 level, chosen when the library loads (``csrc/cpu/levels.h``): the best the
CPU runs, ``NORMLAB_CPU_LEVEL`` forcing a lower one, a level the CPU lacks refused with a message,
and the op tests passing at every level this CPU runs. Each forced level runs in a child process:
the level is bound once, at load."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import normlab
from normlab.ops import extension

ROOT = Path(__file__).resolve().parents[2]
HOME = str(Path(normlab.__file__).resolve().parents[1])  # the children import the normlab this process tests
DISPATCHED = extension.available() and extension.build_info().get("level") == "dispatch"
pytestmark = pytest.mark.skipif(not DISPATCHED, reason="needs the dispatched build of the C++ extension")

# what each level needs, as /proc/cpuinfo (the kernel's view of cpuid) names it: GCC's
# -march=x86-64-v3 / x86-64-v4 (v2's features included)
V3 = {"pni", "ssse3", "cx16", "sse4_1", "sse4_2", "popcnt", "lahf_lm", "avx", "avx2", "bmi1", "bmi2", "f16c", "fma",
      "abm", "movbe"}
V4 = V3 | {"avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl"}
VEC_BYTES = {"v1": 16, "v3": 32, "v4": 64}

_REPORT = "from normlab.ops import extension; import json; print(json.dumps(extension.cpu_level()))"


def _child(code: str, level: str | None, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "NORMLAB_CPU_LEVEL"}
    if level is not None:
        env["NORMLAB_CPU_LEVEL"] = level
    env["PYTHONPATH"] = os.pathsep.join([HOME, env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT, **kw)


def _runs() -> list[str]:
    r = _child(_REPORT, None)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)["cpu_runs"]


def test_the_best_level_this_cpu_runs_is_bound_and_the_report_says_why():
    r = _child(_REPORT, None)
    assert r.returncode == 0, r.stderr[-2000:]
    info = json.loads(r.stdout)
    assert info["built"] == ["v1", "v3", "v4"]
    assert info["cpu_runs"][0] == "v1" and info["level"] == info["cpu_runs"][-1]
    assert "best level this CPU runs" in info["reason"]
    assert info["vec_bytes"] == VEC_BYTES[info["level"]]


@pytest.mark.skipif(platform.machine() != "x86_64" or not Path("/proc/cpuinfo").exists(), reason="x86-64 Linux")
def test_the_levels_read_by_cpuid_match_the_operating_systems_flags():
    flags = extension._cpu_flags()
    expected = ["v1"] + (["v3"] if V3 <= flags else []) + (["v4"] if V4 <= flags else [])
    assert _runs() == expected


def test_each_level_this_cpu_runs_can_be_forced_and_is_reported_as_forced():
    for level in _runs():
        r = _child(_REPORT, level)
        assert r.returncode == 0, r.stderr[-2000:]
        info = json.loads(r.stdout)
        assert info["level"] == level and f"NORMLAB_CPU_LEVEL={level}" in info["reason"]
        assert info["vec_bytes"] == VEC_BYTES[level]


def test_an_unknown_level_is_refused_naming_the_levels_there_are():
    r = _child("import torch, normlab; normlab.nn.LayerNorm(4)(torch.randn(2, 4))", "v2")
    assert r.returncode != 0
    assert "ImportError" in r.stderr and "NORMLAB_CPU_LEVEL=v2" in r.stderr and "v1, v3, v4" in r.stderr


QEMU = shutil.which("qemu-x86_64")


@pytest.mark.skipif(QEMU is None or platform.machine() != "x86_64", reason="needs qemu-user (qemu-x86_64)")
def test_on_an_emulated_cpu_without_avx_v1_is_chosen_and_a_forced_v4_is_refused_with_what_it_lacks():
    # Nehalem (2008): SSE4.2, no AVX. The emulator reports its cpuid; /proc/cpuinfo shows the host's.
    code = ("import json\ntry:\n    from normlab.ops import extension\n    print(json.dumps(extension.cpu_level()))\n"
            "except ImportError as e:\n    print('refused:', e)\n")
    env = {k: v for k, v in os.environ.items() if k != "NORMLAB_CPU_LEVEL"}
    env["PYTHONPATH"] = os.pathsep.join([HOME, env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    cmd = [QEMU, "-cpu", "Nehalem", sys.executable, "-c", code]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads(r.stdout.strip().splitlines()[-1])
    assert info["level"] == "v1" and info["cpu_runs"] == ["v1"] and "avx2" in info["reason"]
    r = subprocess.run(cmd, env={**env, "NORMLAB_CPU_LEVEL": "v4"}, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout.strip().splitlines()[-1]
    assert out.startswith("refused:") and "NORMLAB_CPU_LEVEL=v4" in out and "avx512f" in out and "avx" in out
    assert "choose a level it runs (v1)" in out


# The op tests of every forced level: the differential tests derive their shapes from the bound
# level's vector lanes (chains, tails, chunk boundaries) and compare each op with torch and a float64
# oracle under the accuracy rule; the threads tests check the same bits for any thread count. A
# focused subset, so that the CI's whole run stays within its budget.
FOCUSED = ["tests/ops/test_differential.py", "tests/ops/test_threads.py", "tests/ops/dyt"]


@pytest.mark.parametrize("level", ["v1", "v3"])
def test_the_op_tests_pass_at_a_forced_level(level):
    if level not in _runs():
        pytest.skip(f"this CPU does not run {level}")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    env["NORMLAB_CPU_LEVEL"] = level
    env["PYTHONPATH"] = os.pathsep.join([HOME, env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *FOCUSED],
                       env=env, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-4000:]
    assert " passed" in r.stdout


# Bits across levels. BatchNorm sums in float64 over chunks fixed by the shape: the same bits at
# every level. DyT is elementwise, and its tanh and affine use fused multiply-adds where the level
# has them (v3, v4; cpu/dyt_kernels.cpp): the same bits at v3 and v4, and v1's separate multiplies
# and adds round differently, within the accuracy rule (tests/ops/dyt at a forced v1, above).
# LayerNorm, RMSNorm and GroupNorm sum float32 rows over a vector's lanes (16, 8 or 4 chains:
# another order of additions), so their last bits differ between levels, each level within the
# accuracy rule (the op tests above, per level). Elsewhere no level contracts a multiply and an add
# into a fused multiply-add (-ffp-contract=off everywhere).
_BITS = r"""
import hashlib, torch, normlab
import normlab.functional as F
torch.manual_seed(0)
out = []
with normlab.use_backend("cpu"):
    for dt in (torch.float32, torch.float64, torch.bfloat16):
        x0 = (2 * torch.randn(64, 1000, dtype=torch.float64) + 0.5).to(dt)
        for name, f in (("batch_norm", lambda x: F.batch_norm(x, None, None, training=True)),
                        ("dyt", lambda x: normlab.nn.DyT(1000).to(x.dtype)(x))):
            x = x0.clone().requires_grad_()
            y = f(x)
            g, = torch.autograd.grad(y, x, torch.linspace(-1, 1, y.numel()).reshape(y.shape).to(dt))
            out.append(name + str(dt) + hashlib.sha256(y.detach().contiguous().view(torch.uint8).numpy().tobytes()
                                                       + g.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest())
print("\n".join(out))
"""


def test_batch_norm_gives_the_same_bits_at_every_level_and_dyt_at_every_fma_level():
    got = {}
    for level in _runs():
        r = _child(_BITS, level)
        assert r.returncode == 0, r.stderr[-2000:]
        got[level] = r.stdout.split()
    assert len(got["v1"]) == 6
    bn = {k: [h for h in v if h.startswith("batch_norm")] for k, v in got.items()}
    assert all(v == bn["v1"] for v in bn.values()), bn
    dyt = {k: [h for h in v if h.startswith("dyt")] for k, v in got.items() if k != "v1"}
    assert all(v == next(iter(dyt.values())) for v in dyt.values()), dyt


@pytest.mark.parametrize("level", ["v1", "v3"])
def test_a_streamed_half_precision_output_at_a_narrow_level(level):
    """Half-precision rows whose input and output exceed the last-level cache stream y past the
    caches (numerics/stream.h). At v1 a vector holds 4 half values, an 8-byte store: it was written
    as a 16-byte non-temporal store, which needs 16-byte alignment and writes 8 bytes past the
    vector -- rows of 1028 bfloat16 values start 8 bytes off that alignment every other row, and
    the process died (SIGSEGV). Checked against float64 here, in a child bound to the level."""
    if level not in _runs():
        pytest.skip(f"this CPU does not run {level}")
    code = (
        "import torch, normlab.functional as NF\n"
        "torch.set_num_threads(1)\n"
        "g = torch.Generator().manual_seed(0)\n"
        "x = torch.randn(9001, 1028, generator=g).to(torch.bfloat16)\n"  # 37 MB in + out: > a 32 MB cache
        "w, b = torch.randn(1028, generator=g).to(torch.bfloat16), torch.randn(1028, generator=g).to(torch.bfloat16)\n"
        "y = NF.layer_norm(x, (1028,), w, b).double()\n"
        "r = torch.nn.functional.layer_norm(x.double(), (1028,), w.double(), b.double())\n"
        "print(((y - r).norm() / r.norm()).item())\n"
    )
    r = _child(code, level, timeout=300)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert float(r.stdout.strip().splitlines()[-1]) < 2 ** -8  # bfloat16's rounding, relative, in norm
