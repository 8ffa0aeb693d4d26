"""The demos against their oracle: the numbers the source chapters print.

Every ``EXPECTED`` value below is copied from the chapter's "Output yang
Dihasilkan" block (the file is named beside it); the demos' ``run()`` results,
rounded as the chapter rounds them, must equal those numbers, for normlab and
for torch.nn alike. The CLI must print them, and ``--json`` must parse.
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from normlab import __version__
from normlab.cli import main
from normlab.demos import batchnorm, compare, layernorm, shapes


def r(values, ndigits):
    return [round(v, ndigits) for v in values]


# ---------------------------------------------------------------------------
# seeds/000_846f934512a29b05.txt, layernorm_manual.py, "Output yang Dihasilkan"
# ---------------------------------------------------------------------------
LN_X = [  # "x (4 sampel x 6 fitur):", round(v, 2)
    [10.78, 9.46, 7.7, -1.32, 7.04, 1.3],
    [4.87, 0.19, 6.07, 2.94, 3.52, 5.72],
    [1.67, 5.27, -1.95, 4.35, 4.07, 3.81],
    [7.41, 3.14, 3.22, 4.81, 2.51, 5.99],
]
LN_Y = [  # "output manual (gamma * x_hat + beta):", round(v, 3)
    [1.135, 1.666, 0.215, -3.637, 0.277, -1.038],
    [0.495, -3.712, 0.548, -2.474, -0.183, 0.923],
    [-0.498, 1.991, -0.998, -1.388, 0.497, 0.39],
    [1.661, -1.583, -0.37, -1.83, -1.148, 0.848],
]
LN_XHAT_MEAN = [-0.0, -0.0, -0.0, -0.0]  # "mean   :", round(v + 0.0, 4)
LN_XHAT_STD = [1.0, 1.0, 1.0, 1.0]  # "std    :", round(v, 4)
LN_XHAT_COL_MEAN = [0.698, -0.205, -0.303, -0.332, -0.139, 0.281]  # "mean kolom x_hat", round 3
LN_MAX_DIFF = 2.384185791015625e-07  # "selisih maksimum:" (the prose: "2,4 x 10^-7")
LN_THIRD = [-0.498, 1.991, -0.998, -1.388, 0.497, 0.39]  # "sendirian :" and "di batch  :"
BN_ZERO_MATE = [1.0, 1.0, -1.0, 1.0, 1.0, 1.0]  # "teman nol :"
BN_RANDOM_MATES = [-0.879, 0.704, -0.857, 0.443, 0.878, -0.157]  # "teman acak:"

# ---------------------------------------------------------------------------
# seeds/001_11e0a8c571f1839d.txt, batchnorm_train_eval.py, "Output yang Dihasilkan"
# ---------------------------------------------------------------------------
BN_ANATOMY = {"weight": [1.0, 1.0, 1.0], "bias": [0.0, 0.0, 0.0], "eps": 1e-05, "momentum": 0.1,
              "running_mean": [0.0, 0.0, 0.0], "running_var": [1.0, 1.0, 1.0]}
BN_TRAIN_OUT = [  # "output train (tiap channel: mean 0, variansi 1):", round 4
    [-1.3416, -1.3416, -1.3416],
    [-0.4472, -0.4472, -0.4472],
    [0.4472, 0.4472, 0.4472],
    [1.3416, 1.3416, 1.3416],
]
BN_COL_MEAN = [0.0, 0.0, 0.0]  # "rata-rata kolom :"
BN_COL_VAR = [1.0, 1.0, 1.0]  # "variansi kolom  :"
BN_RUNNING_MEAN = [0.4, 0.5, 0.6]  # "running_mean setelah batch :", round 3
BN_RUNNING_VAR = [1.567, 1.567, 1.567]  # "running_var  setelah batch :", round 3
BN_TRAIN_A = [-0.5071] * 3  # "train di batch A :"
BN_TRAIN_B = [-1.2828] * 3  # "train di batch B :"
BN_EVAL = [0.0331] * 3  # "eval sendirian   :" and "eval di batch B  :"
BN_EVAL_S2 = [1.2783, 2.7963, 4.3142]  # "eval sebelum ubah gamma/beta :" and "rumus manual"
BN_AFFINE = [12.5566, 2.7963, -7.8429]  # "output layer   :" and "manual g*x+b   :"

IMPLS = ("normlab", "torch")


@pytest.fixture(scope="module")
def ln_result():
    return layernorm.run()


@pytest.fixture(scope="module")
def bn_result():
    return batchnorm.run()


@pytest.fixture(scope="module")
def shapes_result():
    return shapes.run()


@pytest.fixture(scope="module")
def compare_result():
    return compare.run()


# --------------------------------------------------------------- layernorm


def test_layernorm_input_is_the_chapters(ln_result):
    assert [r(row, 2) for row in ln_result["x"]] == LN_X


@pytest.mark.parametrize("impl", ["manual", *IMPLS])
def test_layernorm_output_matches_chapter(ln_result, impl):
    assert [r(row, 3) for row in ln_result["output"][impl]] == LN_Y


@pytest.mark.parametrize("impl", ["manual", *IMPLS])
def test_layernorm_x_hat_statistics_match_chapter(ln_result, impl):
    stats = ln_result["x_hat_stats"][impl]
    assert r(stats["row_mean"], 4) == LN_XHAT_MEAN  # -0.0 == 0.0: the sign of zero is not checked
    assert r(stats["row_std"], 4) == LN_XHAT_STD
    assert r(stats["col_mean"], 3) == LN_XHAT_COL_MEAN


def test_layernorm_normlab_equals_torch_and_manual(ln_result):
    out = {k: torch.tensor(v) for k, v in ln_result["output"].items()}
    torch.testing.assert_close(out["normlab"], out["torch"], atol=1e-6, rtol=0)
    torch.testing.assert_close(out["normlab"], out["manual"], atol=1e-6, rtol=0)
    assert ln_result["allclose_atol_1e-6"] == {"manual_vs_torch": True, "normlab_vs_torch": True,
                                               "normlab_vs_manual": True}
    # the chapter's max |manual - torch.nn| is 2.384185791015625e-07 (prose: "2,4 x 10^-7"):
    # a float32 rounding difference, compared to two significant digits
    assert f"{ln_result['max_abs_diff']['manual_vs_torch']:.1e}" == f"{LN_MAX_DIFF:.1e}"
    assert ln_result["max_abs_diff"]["normlab_vs_torch"] <= 1e-6


@pytest.mark.parametrize("impl", IMPLS)
def test_layernorm_batch_independence_matches_chapter(ln_result, impl):
    ind = ln_result["batch_independence"][impl]
    assert r(ind["alone"], 3) == LN_THIRD
    assert r(ind["in_batch"], 3) == LN_THIRD
    assert ind["identical"] is True


@pytest.mark.parametrize("impl", IMPLS)
def test_layernorm_batchnorm_contrast_matches_chapter(ln_result, impl):
    c = ln_result["batchnorm_train_contrast"][impl]
    assert r(c["zero_mate"], 3) == BN_ZERO_MATE
    assert r(c["random_mates"], 3) == BN_RANDOM_MATES
    assert c["identical"] is False


def test_layernorm_batchnorm_contrast_normlab_equals_torch(ln_result):
    n, t = (ln_result["batchnorm_train_contrast"][i] for i in IMPLS)
    for key in ("zero_mate", "random_mates"):
        torch.testing.assert_close(torch.tensor(n[key]), torch.tensor(t[key]), atol=1e-6, rtol=0)


def test_layernorm_does_not_touch_the_global_rng():
    state = torch.get_rng_state()
    layernorm.run()
    assert torch.equal(state, torch.get_rng_state())


# --------------------------------------------------------------- batchnorm


@pytest.mark.parametrize("impl", IMPLS)
def test_batchnorm_matches_chapter(bn_result, impl):
    d = bn_result[impl]
    assert d["anatomy"] == BN_ANATOMY
    assert [r(row, 4) for row in d["train"]["output"]] == BN_TRAIN_OUT
    assert r(d["train"]["col_mean"], 4) == BN_COL_MEAN
    assert r(d["train"]["col_var"], 4) == BN_COL_VAR
    assert r(d["train"]["running_mean"], 3) == BN_RUNNING_MEAN
    assert r(d["train"]["running_var"], 3) == BN_RUNNING_VAR
    dep = d["batch_dependence"]
    assert r(dep["train_batch_a"], 4) == BN_TRAIN_A
    assert r(dep["train_batch_b"], 4) == BN_TRAIN_B
    assert r(dep["eval_alone"], 4) == BN_EVAL
    assert r(dep["eval_in_batch_b"], 4) == BN_EVAL
    assert dep["eval_identical"] is True
    ev = d["eval"]
    assert r(ev["output"], 4) == BN_EVAL_S2
    assert r(ev["manual"], 4) == BN_EVAL_S2
    assert r(ev["affine_output"], 4) == BN_AFFINE
    assert r(ev["affine_manual"], 4) == BN_AFFINE
    assert ev["affine_match"] is True


def test_batchnorm_normlab_equals_torch(bn_result):
    for name, diff in bn_result["max_abs_diff_normlab_vs_torch"].items():
        assert diff <= 1e-6, name
    n, t = bn_result["normlab"], bn_result["torch"]
    torch.testing.assert_close(torch.tensor(n["train"]["output"]), torch.tensor(t["train"]["output"]),
                               atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.tensor(n["train"]["running_var"]),
                               torch.tensor(t["train"]["running_var"]), atol=1e-6, rtol=0)


# ------------------------------------------------------------------ shapes


@pytest.mark.parametrize("impl", IMPLS)
def test_shapes_match_chapter(shapes_result, impl):
    # seeds/003_cf50894ab39a8080.txt: x [32, 10, 512], LayerNorm(512): weight/bias "# [d_model]"
    s = shapes_result[impl]
    assert s["input_shape"] == [32, 10, 512]
    assert s["output_shape"] == [32, 10, 512]
    assert s["weight_shape"] == [512]
    assert s["bias_shape"] == [512]
    assert s["batch1_output_shape"] == [1, 10, 512]
    assert s["batch1_equals_full_batch"] is True  # "works correctly even at batch_size=1"
    assert s["max_abs_row_mean"] < 1e-5 and s["max_abs_row_std_minus_1"] < 1e-4


def test_shapes_normlab_equals_torch(shapes_result):
    assert shapes_result["normlab_allclose_torch"] is True
    assert shapes_result["normlab_vs_torch_max_abs_diff"] <= 1e-5


# ----------------------------------------------------------------- compare


def test_compare_table_cells(compare_result):
    t = compare_result["table"]
    assert t["stats_axis"]["BatchNorm1d"].startswith("dim 0")
    assert t["stats_axis"]["LayerNorm"].startswith("dim 1")
    assert t["depends_train"] == {"BatchNorm1d": "yes", "LayerNorm": "no"}
    assert t["depends_eval"] == {"BatchNorm1d": "no", "LayerNorm": "no"}
    assert t["batch1_train"] == {"BatchNorm1d": "no (ValueError)", "LayerNorm": "yes"}
    assert t["batch1_eval"] == {"BatchNorm1d": "yes", "LayerNorm": "yes"}
    assert t["running_stats"]["BatchNorm1d"].startswith("yes")
    assert t["running_stats"]["LayerNorm"] == "no buffers"
    assert t["params"] == {"BatchNorm1d": "weight [6], bias [6]", "LayerNorm": "weight [6], bias [6]"}
    assert compare_result["same_as_torch"] is True, compare_result["differences_from_torch"]


def test_compare_measurements(compare_result):
    bn, ln = (compare_result["normlab"][k] for k in ("BatchNorm1d", "LayerNorm"))
    assert (bn["dim0_mean0_var1"], bn["dim1_mean0_var1"]) == (True, False)
    assert (ln["dim0_mean0_var1"], ln["dim1_mean0_var1"]) == (False, True)
    assert bn["max_change_train"] > 0.1 and bn["max_change_eval"] == 0.0
    assert ln["max_change_train"] == 0.0 and ln["max_change_eval"] == 0.0
    assert "more than 1 value per channel" in bn["batch_size_1_train"]["error"]
    assert set(bn["buffers"]) >= {"running_mean", "running_var"} and bn["running_stats_updated_in_train"]
    assert ln["buffers"] == {}


# --------------------------------------------------------------------- CLI

CLI_CASES = [
    (["demo", "layernorm"], layernorm, [LN_X[0], LN_Y[3], LN_XHAT_COL_MEAN, LN_THIRD, BN_ZERO_MATE,
                                        BN_RANDOM_MATES, repr(LN_MAX_DIFF)]),
    (["demo", "batchnorm"], batchnorm, [BN_TRAIN_OUT[0], BN_RUNNING_MEAN, BN_RUNNING_VAR, BN_TRAIN_A,
                                        BN_TRAIN_B, BN_EVAL, BN_EVAL_S2, BN_AFFINE]),
    (["demo", "shapes"], shapes, ["torch.Size([32, 10, 512])", "torch.Size([512])"]),
    (["compare"], compare, ["dim 0 (per feature, over batch)", "no (ValueError)", "no buffers"]),
]
FIXTURE = {layernorm: "ln_result", batchnorm: "bn_result", shapes: "shapes_result",
           compare: "compare_result"}
CLI_IDS = [" ".join(argv) for argv, _, _ in CLI_CASES]


@pytest.mark.parametrize("argv,module,printed", CLI_CASES, ids=CLI_IDS)
def test_cli_prints_the_chapters_numbers(argv, module, printed, capsys, monkeypatch, request):
    cached = request.getfixturevalue(FIXTURE[module])
    monkeypatch.setattr(module, "run", lambda **kw: cached)  # the CLI's part: parse, run, print
    assert main(argv) == 0
    text = capsys.readouterr().out
    for item in printed:
        assert (item if isinstance(item, str) else repr(item)) in text


@pytest.mark.parametrize("argv,module,printed", CLI_CASES, ids=CLI_IDS)
def test_cli_json_parses(argv, module, printed, capsys, monkeypatch, request):
    cached = request.getfixturevalue(FIXTURE[module])
    monkeypatch.setattr(module, "run", lambda **kw: cached)
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(cached))


def test_cli_passes_options_to_run(capsys, monkeypatch):
    seen = {}
    monkeypatch.setattr(shapes, "run", lambda **kw: seen.update(kw) or {"ok": True})
    assert main(["demo", "shapes", "--seed", "3", "--sample", "0", "--json"]) == 0
    assert seen == {"seed": 3, "sample": 0, "lang": "en"}
    assert json.loads(capsys.readouterr().out) == {"ok": True}


def test_cli_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"normlab {__version__}"


def test_cli_without_a_command_fails(capsys):
    with pytest.raises(SystemExit) as e:
        main(["demo"])
    assert e.value.code == 2


def test_python_dash_m_normlab(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["normlab", "--version"])
    with pytest.raises(SystemExit) as e:
        runpy.run_module("normlab", run_name="__main__")
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"normlab {__version__}"


def test_installed_console_script():
    exe = Path(sys.executable).with_name("normlab")
    exe = str(exe) if exe.exists() else shutil.which("normlab")
    assert exe, "the `normlab` console script is not installed (pip install -e .)"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([exe, "demo", "layernorm"], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert repr(LN_X[0]) in done.stdout
    assert repr(BN_RANDOM_MATES) in done.stdout
