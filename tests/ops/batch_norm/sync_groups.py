"""One spawned gloo group per world size for the whole session (start-up dominates a run).

The fixtures ``world_2`` and ``world_3``, shared by the SyncBatchNorm tests (``test_sync.py``) and
``tests/experiments/test_ddp.py``: ``tests/conftest.py`` loads this module as a plugin."""

from __future__ import annotations

import pytest

from . import spawn
from . import sync_cases as cases
from . import sync_workers as workers


@pytest.fixture(scope="session")
def world_2():
    """Rank results of the world-2 run: ``cases``, ``compiled``, ``ddp``, ``faults`` (rank 1 exits with 7)."""
    from normlab.experiments import ddp

    results = spawn.run_raw(workers.world_2_worker, 2, list(cases.CASES_2.values()), cases.COMPILE_CASE,
                            ddp._config(**cases.DDP_OPTIONS), timeout_s=60, deadline_s=120)
    for rank, r in enumerate(results):
        assert "ok" in r, f"rank {rank} of 2: {r.get('error', r)}"
    assert [r["exitcode"] for r in results] == [0, 7]
    return [r["ok"] for r in results]


@pytest.fixture(scope="session")
def world_3():
    return spawn.run(workers.world_3_worker, 3, list(cases.CASES_3.values()), cases.SUBSET_CASE,
                     cases.SUBSET_MEMBERS, cases.MOMENT_CHUNKS, timeout_s=60, deadline_s=120)
