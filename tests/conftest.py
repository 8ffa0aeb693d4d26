"""Every test starts from the same global random state, so a run is reproducible:
a failure seen once is seen again with the same numbers (tests that need other
data build their own ``torch.Generator``)."""

import pytest
import torch

# the spawned gloo groups (session fixtures world_2, world_3): SyncBatchNorm and the ddp experiment share them
pytest_plugins = ["tests.ops.batch_norm.sync_groups"]


@pytest.fixture(autouse=True)
def _seed_global_rng():
    torch.manual_seed(0)
