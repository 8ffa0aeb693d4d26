"""The interleaved median timer: every provider of one case and mode, round-robin.

Why interleaved: on a shared machine the background load drifts over seconds.
Timing provider A for ten seconds and then provider B for ten seconds puts the
drift into the A/B ratio; taking one sample of each provider per repeat (in a
rotating order) exposes all of them to the same drift, and the median of the
repeats drops the outliers.

Per provider:

1. first call: ``prepare()`` and one call of its result, timed once -- the
   compile time of ``torch.compile``, the first load of the ``"cpu"``
   kernels, lazy initialisation. Reported apart, never in the median.
2. calibration: one more call sets ``inner``, the number of calls per sample, so
   that a sample lasts at least ``min_sample_s`` (a 4x6 op takes microseconds; a
   single ``perf_counter`` pair would measure the timer).
3. warm-up: ``warmup`` samples, discarded.
4. repeats: each repeat takes one sample of every provider, the order rotated by
   one each repeat. A sample is the mean time per call over ``inner`` calls, with
   Python's garbage collector paused. Results are dropped inside the loop, so
   each call pays its own allocation and free, as in real use.

The clock: a sample on one thread (``torch.get_num_threads() == 1``: torch's and normlab's
kernels then run on the calling thread) is timed in that thread's CPU time
(``time.thread_time``, which counts its page faults and kernel time but not the time other
processes hold the core); on more threads, in wall time (``time.perf_counter``).
``NORMLAB_BENCH_CLOCK=wall`` takes wall time everywhere. On a quiet machine the two agree;
on a shared one the 1-thread ratios stay meaningful while the wall times do not.

After ``min_repeats`` repeats the loop stops early once ``max_total_s`` has
passed (a 256 MB reference backward takes a while).

A provider whose first call raises is reported with a status (``"n/a"`` for
"not available yet" exceptions, ``"error"`` otherwise) and left out.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import statistics
import time
from collections.abc import Callable, Mapping

from .cases import Candidate, exception_status


@dataclasses.dataclass
class Timing:
    """The result for one provider. Times in seconds per call."""

    status: str = "ok"           # "ok" | "n/a" | "error"
    reason: str = ""
    first_call_s: float | None = None
    median_s: float | None = None
    min_s: float | None = None
    inner: int = 0               # calls per sample
    samples: list[float] = dataclasses.field(default_factory=list)


def sample_clock() -> Callable[[], float]:
    """The clock of a sample taken now: thread CPU time on one thread, else wall time (above)."""
    import torch

    if torch.get_num_threads() == 1 and os.environ.get("NORMLAB_BENCH_CLOCK", "") != "wall":
        return time.thread_time
    return time.perf_counter


def _sample(fn: Callable, inner: int) -> float:
    clock = sample_clock()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        t0 = clock()
        for _ in range(inner):
            fn()
        return (clock() - t0) / inner
    finally:
        if gc_was_enabled:
            gc.enable()


def time_interleaved(
    candidates: Mapping[str, Candidate],
    repeats: int = 11,
    warmup: int = 2,
    min_sample_s: float = 2e-3,
    max_total_s: float = 30.0,
    min_repeats: int = 3,
    max_inner: int = 10_000,
    after_call: Callable[[str], None] | None = None,
) -> dict[str, Timing]:
    """Time every candidate, interleaved; returns ``{provider: Timing}`` in the given order.

    ``after_call(provider)`` runs after each first call and each sample, untimed
    (``run_bench`` uses it to put back a thread count that a provider changed).
    """
    after = after_call or (lambda name: None)
    results: dict[str, Timing] = {name: Timing() for name in candidates}
    ready: dict[str, Callable] = {}
    for name, cand in candidates.items():
        res = results[name]
        try:
            with cand.context():
                t0 = time.perf_counter()
                fn = cand.prepare()
                fn()
                res.first_call_s = time.perf_counter() - t0
                clock = sample_clock()
                t1 = clock()
                fn()
                one = max(clock() - t1, 1e-9)
        except Exception as e:  # noqa: BLE001 - a provider's failure is a row, not a crash
            res.status, res.reason = exception_status(e)
            continue
        finally:
            after(name)
        res.inner = int(min(max_inner, max(1, math.ceil(min_sample_s / one))))
        ready[name] = fn

    def failed(name: str, e: Exception) -> None:
        results[name].status, results[name].reason = exception_status(e)
        results[name].samples.clear()
        del ready[name]

    for name in list(ready):
        try:
            with candidates[name].context():
                for _ in range(warmup):
                    _sample(ready[name], results[name].inner)
        except Exception as e:  # noqa: BLE001
            failed(name, e)
        after(name)

    start = time.perf_counter()
    for r in range(max(1, repeats)):
        names = list(ready)
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            try:
                with candidates[name].context():
                    results[name].samples.append(_sample(ready[name], results[name].inner))
            except Exception as e:  # noqa: BLE001
                failed(name, e)
            after(name)
        if r + 1 >= min_repeats and time.perf_counter() - start > max_total_s:
            break
    for name in ready:
        res = results[name]
        res.median_s = statistics.median(res.samples)
        res.min_s = min(res.samples)
    return results
