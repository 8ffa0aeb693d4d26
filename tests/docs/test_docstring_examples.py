"""The examples in the public docstrings (shown in the site's API reference) run and print
what they say: doctest over normlab, normlab.nn, normlab.functional and the tools."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import normlab


def _modules() -> list[str]:
    names = ["normlab", "normlab.functional", "normlab.tools"]
    for pkg in ("normlab.nn", "normlab.tools"):
        mod = importlib.import_module(pkg)
        names += [f"{pkg}.{m.name}" for m in pkgutil.iter_modules(mod.__path__) if m.name not in ("hf", "timm")]
    return sorted(set(names + ["normlab.nn"]))


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples_run(name):
    mod = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(mod, name, globs={"torch": __import__("torch"), "normlab": normlab}):
        runner.run(test)
    res = runner.summarize(verbose=False)
    assert res.failed == 0, f"{res.failed} of {res.attempted} docstring examples in {name} failed (see above)"


def test_there_are_examples_to_run():
    finder = doctest.DocTestFinder(exclude_empty=True)
    n = sum(len(t.examples) for name in _modules() for t in finder.find(importlib.import_module(name), name))
    assert n >= 10
