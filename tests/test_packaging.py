"""What the wheel holds and what it needs: the library alone (torch and numpy); the experiments'
packages come with the ``experiments`` extra, the docs site's build tooling stays in
``docs/_tooling/``. A user without the extra imports normlab and uses its layers, and a
command that needs the extra says in one line which one to install."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import setuptools

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ("matplotlib", "sklearn", "rich", "markdown")
DOCS_TOOLING = ("mkdocs", "material", "griffe", "mkdocstrings", "latex2mathml")

# a finder ahead of every other that refuses the experiments' packages, as if not installed
BLOCK = f"""
import sys
class _Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {EXPERIMENTS!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _Refuse())
"""


def _python(code: str, *args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + code, *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})


def test_the_library_works_without_the_experiments_extra():
    p = _python("""
import torch
import normlab, normlab.nn, normlab.functional
model = normlab.convert(torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.LayerNorm(6)))
x = torch.randn(8, 4, requires_grad=True)
model(x).sum().backward()
assert type(model[1]) is normlab.nn.BatchNorm1d and x.grad is not None
y = normlab.functional.group_norm(torch.randn(2, 4, 3), 2)
normlab.recalibrate_batch_norm(model, [torch.randn(8, 4)])          # no progress bar without rich
report = normlab.inspect(model, torch.randn(8, 4), show=False)
for call in (lambda: normlab.inspect(model, torch.randn(8, 4)),
             lambda: normlab.recalibrate_batch_norm(model, [torch.randn(8, 4)], progress=True)):
    try:
        call()
    except ModuleNotFoundError as e:
        print(e)
assert not set(sys.modules) & set({EXPERIMENTS!r}), sorted(set(sys.modules) & set({EXPERIMENTS!r}))
print("ok")
""".replace("{EXPERIMENTS!r}", repr(EXPERIMENTS)))
    assert p.returncode == 0, p.stderr
    inspect, recalibrate, ok = p.stdout.strip().splitlines()
    assert ok == "ok"
    assert inspect.startswith("normlab.inspect(show=True): needs rich")
    assert recalibrate.startswith("normlab.recalibrate_batch_norm(progress=True): needs rich")
    assert all("pip install 'normlab[experiments]'" in said for said in (inspect, recalibrate))


def test_a_command_that_needs_the_extra_says_which_in_one_line(tmp_path):
    store = ROOT / "docs" / "runs" / "stability.sqlite"
    run = "from normlab.cli import main; sys.exit(main(sys.argv[1:]))"
    p = _python(run, "--help", cwd=tmp_path)                   # every command's parser builds
    assert p.returncode == 0 and "experiment" in p.stdout, p.stderr
    p = _python(run, "report", "--store", str(store), "--out", str(tmp_path / "r"), cwd=tmp_path)
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith("normlab report: needs ") and "normlab[experiments]" in p.stderr
    for experiment in ("stability", "train-eval", "batch-size"):  # refused before the store is created
        new_store = tmp_path / f"{experiment}.sqlite"
        p = _python(run, "experiment", experiment, "--quick", "--store", str(new_store), cwd=tmp_path)
        assert p.returncode == 1 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
        assert p.stderr.startswith(f"normlab experiment {experiment}: needs scikit-learn"), p.stderr
        assert not new_store.exists()


def _project() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def test_core_dependencies_are_torch_and_numpy_and_the_extras_bring_the_rest():
    project = _project()
    assert sorted(r.split(">")[0].split("=")[0] for r in project["dependencies"]) == ["numpy", "torch"]
    extras = project["optional-dependencies"]
    assert sorted(r.split(">")[0] for r in extras["experiments"]) == ["markdown", "matplotlib", "rich", "scikit-learn"]
    assert "normlab[experiments]" in extras["test"] and "normlab[experiments]" in extras["docs"]


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_wheel_holds_no_docs_site_tooling():
    """The packages setuptools puts in the wheel (pyproject's packages.find) import no MkDocs or
    griffe code; the hooks and the griffe extension live in docs/_tooling/, where mkdocs.yml loads them."""
    packages = setuptools.find_packages(where=str(ROOT / "src"))
    assert "normlab" in packages and not any("tooling" in p or p.startswith("docs") for p in packages)
    files = [f for p in packages for f in (ROOT / "src" / p.replace(".", "/")).glob("*.py")]
    assert len(files) > 50
    offenders = {str(f.relative_to(ROOT)): sorted(_imports(f) & set(DOCS_TOOLING)) for f in files}
    assert {f: names for f, names in offenders.items() if names} == {}
    assert not [f for f in files if f.stem in ("mkdocs_hooks", "griffe_doctest")]
    config = (ROOT / "mkdocs.yml").read_text()
    for tool in ("mkdocs_hooks.py", "griffe_doctest.py"):
        assert (ROOT / "docs" / "_tooling" / tool).is_file() and f"docs/_tooling/{tool}" in config
