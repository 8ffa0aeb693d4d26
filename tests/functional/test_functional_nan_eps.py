"""``eps=NaN`` is refused by every function of ``normlab.functional``, with the message of a bad
``eps``, before any work. (The agreement tests of the fast and the full checks cannot see this:
both paths share ``check_eps``.)"""

from __future__ import annotations

import math

import pytest
import torch

import normlab
import normlab.functional as NF

_X = torch.randn(4, 6, 5)

_CALLS = {
    "layer_norm": lambda eps: NF.layer_norm(_X, (5,), eps=eps),
    "rms_norm": lambda eps: NF.rms_norm(_X, (5,), eps=eps),
    "add_layer_norm": lambda eps: NF.add_layer_norm(_X, _X, (5,), eps=eps),
    "add_rms_norm": lambda eps: NF.add_rms_norm(_X, _X, (5,), eps=eps),
    "batch_norm": lambda eps: NF.batch_norm(_X, torch.zeros(6), torch.ones(6), training=False, eps=eps),
    "group_norm": lambda eps: NF.group_norm(_X, 3, eps=eps),
    "instance_norm": lambda eps: NF.instance_norm(_X, eps=eps),
    "layer_norm2d": lambda eps: NF.layer_norm2d(_X.unsqueeze(-1), eps=eps),
}


@pytest.mark.parametrize("backend", ["cpu", "ref"])
@pytest.mark.parametrize("op", list(_CALLS))
def test_nan_eps_is_refused(op, backend):
    with normlab.use_backend(backend), pytest.raises(ValueError, match=r"expected eps to be a non-negative number, got nan$"):
        _CALLS[op](math.nan)
