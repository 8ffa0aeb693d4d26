"""SyncBatchNorm on GPUs with NCCL (skipped without two CUDA devices): the same cases and oracle as on CPU."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from . import spawn
from . import sync_workers as workers
from .sync_cases import CASES_2
from .test_sync import _check

needs_two_gpus = pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.device_count() >= 2 and dist.is_nccl_available()),
    reason="needs 2 CUDA devices and NCCL",
)


@needs_two_gpus
def test_nccl_world_size_2_equals_batch_norm_on_the_concatenated_batch():
    outs = spawn.run(workers.gpu_worker, 2, list(CASES_2.values()), backend="nccl", timeout_s=60)
    for i, name in enumerate(CASES_2):
        _check(CASES_2[name], [o[i] for o in outs], name)
