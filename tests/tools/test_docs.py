"""The examples in the tools' docstrings run and print what they say."""

from __future__ import annotations

import doctest

import pytest

from normlab.nn import frozen_batch_norm
from normlab.tools import folding, freezing, inspection, recalibration


@pytest.mark.parametrize("module", [frozen_batch_norm, freezing, recalibration, folding, inspection],
                         ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
