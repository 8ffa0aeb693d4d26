"""BatchNorm refuses one running statistic without the other, with torch's class and words, before
any work: in training a ValueError about the pair, in evaluation a RuntimeError naming the missing one. (The agreement tests of the fast and the full checks cannot see this:
both paths share the check.)"""

from __future__ import annotations

import pytest
import torch

import normlab
import normlab.functional as NF

_X = torch.randn(4, 6, 5)
_MESSAGE = "running_mean and running_var must either both be None or neither be None"


@pytest.mark.parametrize("backend", ["cpu", "ref"])
@pytest.mark.parametrize("which", ["running_mean only", "running_var only"])
def test_batch_norm_in_training_refuses_half_a_running_pair(which, backend):
    def pair():
        return (torch.zeros(6), None) if which == "running_mean only" else (None, torch.ones(6))

    with pytest.raises(ValueError, match=_MESSAGE):  # torch's class and words
        torch.nn.functional.batch_norm(_X, *pair(), training=True)
    rm, rv = pair()
    with normlab.use_backend(backend), pytest.raises(ValueError, match=_MESSAGE):
        NF.batch_norm(_X, rm, rv, training=True)
    given, start = (rm, torch.zeros(6)) if rm is not None else (rv, torch.ones(6))
    torch.testing.assert_close(given, start, rtol=0, atol=0)  # nothing was written into it


@pytest.mark.parametrize("backend", ["cpu", "ref"])
@pytest.mark.parametrize("which", ["running_mean only", "running_var only"])
def test_batch_norm_in_evaluation_names_the_missing_running_statistic(which, backend):
    rm, rv = (torch.zeros(6), None) if which == "running_mean only" else (None, torch.ones(6))
    missing = "running_var" if which == "running_mean only" else "running_mean"
    with pytest.raises(RuntimeError, match=f"{missing} must be defined in evaluation mode"):  # torch's
        torch.nn.functional.batch_norm(_X, rm, rv, training=False)
    with normlab.use_backend(backend), pytest.raises(RuntimeError, match=f"{missing} must be defined in evaluation mode"):
        NF.batch_norm(_X, rm, rv, training=False)
