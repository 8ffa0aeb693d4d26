"""Every test starts from the same global random state, so a run is reproducible:
a failure seen once is seen again with the same numbers (tests that need other
data build their own ``torch.Generator``)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed_global_rng():
    torch.manual_seed(0)
