"""A call whose memory cannot be had raises torch's own RuntimeError, naming the size, and leaves
nothing allocated -- in every family, on the "cpu" backend."""

from __future__ import annotations

import gc

import pytest
import torch

import normlab
import normlab.nn as NN

# each layer on an input whose output alone would need 8 TiB (an expanded view of one value)
LAYERS = {
    "BatchNorm2d": lambda: NN.BatchNorm2d(2),
    "BatchNorm2d_eval": lambda: NN.BatchNorm2d(2).eval(),
    "GroupNorm": lambda: NN.GroupNorm(1, 2),
    "InstanceNorm2d": lambda: NN.InstanceNorm2d(2),
    "LayerNorm": lambda: NN.LayerNorm(2**20),
    "RMSNorm": lambda: NN.RMSNorm(2**20),
}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.parametrize("name", list(LAYERS))
def test_impossible_call_raises_torchs_error_and_keeps_nothing(name):
    layer = LAYERS[name]()
    x = torch.zeros(1).expand(1, 2, 2**20, 2**20)
    gc.collect()
    before = _rss()
    with normlab.use_backend("cpu"), torch.no_grad(), pytest.raises(RuntimeError, match=r"allocate \d+ bytes"):
        layer(x)
    gc.collect()
    assert _rss() - before < 16 * 2**20
