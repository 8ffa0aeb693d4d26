"""``normlab experiment ddp``: SyncBatchNorm tracks one process at the global batch; a failing rank is named.

The example's distributed runs ran in the world-2 group (``tests/ops/batch_norm/sync_workers.world_2_worker``);
here ``ddp.run`` adds the single-process reference (torch.nn.BatchNorm1d at the
global batch), compares and stores, as the command does after its ranks finish.
"""

from __future__ import annotations

import sqlite3

import pytest

from normlab.experiments import ddp
from normlab.experiments.store import Store

from tests.ops.batch_norm.sync_cases import DDP_OPTIONS


def test_sync_batch_norm_tracks_the_single_process_run_and_is_stored(world_2, tmp_path):
    store = tmp_path / "runs.sqlite"
    r = ddp.run(**DDP_OPTIONS, store=str(store), _dist=world_2[0]["ddp"])
    gap = r["final"]["max_loss_gap"]
    assert gap["sync"] < 1e-5, gap  # float32 rounding over 12 steps
    assert gap["local"] > 1e-2, gap  # per-rank statistics of 4 samples: another training path
    assert abs(r["final"]["sync"]["eval_acc"] - r["final"]["single"]["eval_acc"]) < 1e-6
    t = r["final"]["timing"]
    assert t["layers"] == 3 and t["sync"] > 0 and t["local"] > 0
    text = ddp.render(r)
    assert "SyncBatchNorm tracks the single-process run" in text and "overhead" in text
    with Store(store) as st:
        (rec,) = st.runs("ddp")
    assert rec["config"] == {k: DDP_OPTIONS[k] for k in ("nproc", "batch", "steps", "lr")}
    assert set(rec["epochs"]) == {"sync", "local", "single"} and len(rec["epochs"]["sync"]) == 12
    again = ddp.run(**DDP_OPTIONS, store=str(store), _dist=world_2[0]["ddp"])
    assert again["stored"] is False  # one record per configuration


def test_a_failing_rank_stops_the_run_naming_it_and_stores_nothing(tmp_path):
    store = tmp_path / "runs.sqlite"
    with pytest.raises(SystemExit) as info:
        ddp.run(nproc=2, batch=2, steps=ddp.FAIL_STEP + 1, quick=True, timeout=10, store=str(store), fail_rank=1)
    message = str(info.value.code)
    assert message.startswith("normlab experiment ddp: rank 1 failed: RuntimeError: injected failure"), message
    assert "then rank 0 stopped as well" in message, message
    if store.exists():
        assert sqlite3.connect(store).execute("SELECT COUNT(*) FROM runs").fetchone() == (0,)
