"""The sample clock of normlab.bench.timing: thread CPU time on one thread, wall time otherwise."""

from __future__ import annotations

import time

import torch

from normlab.bench import timing


def _with_threads(n, fn):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn()
    finally:
        torch.set_num_threads(old)


def test_one_thread_samples_take_cpu_time_not_waiting(monkeypatch):
    monkeypatch.delenv("NORMLAB_BENCH_CLOCK", raising=False)
    # a call that waits 20 ms and computes nothing: no CPU time on one thread, 20 ms of wall time
    waited = _with_threads(1, lambda: timing._sample(lambda: time.sleep(0.02), 1))
    assert waited < 0.005
    monkeypatch.setenv("NORMLAB_BENCH_CLOCK", "wall")
    assert _with_threads(1, lambda: timing._sample(lambda: time.sleep(0.02), 1)) >= 0.019


def test_more_threads_take_wall_time(monkeypatch):
    monkeypatch.delenv("NORMLAB_BENCH_CLOCK", raising=False)
    assert _with_threads(2, timing.sample_clock) is time.perf_counter
    assert _with_threads(1, timing.sample_clock) is time.thread_time
