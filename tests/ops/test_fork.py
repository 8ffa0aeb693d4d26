"""normlab in forked processes: DataLoader workers, a fork Pool, a plain forked child.

The "cpu" kernels run on torch's own thread pool (``at::parallel_for``, GNU OpenMP in torch's
CPU build), so a forked child behaves as torch's own ops do there:

- a forked child with one thread (as DataLoader workers and most pool workers run) computes
  the same bits as the parent, whether or not the parent had started the thread pool;
- a forked child that keeps the parent's thread count runs normlab, small and large inputs,
  when the parent had not started the pool. (When it had, libgomp hangs the child's first
  parallel region -- torch's own large ops as well as normlab's: measured here with torch.nn's
  layers, a child still hung after 40 s. normlab no longer runs a pool of its own, so it has
  no other behaviour to offer there; DataLoader workers and ``torch.set_num_threads(1)`` in the
  child are the way, for torch and normlab alike.)

Each scenario runs in a fresh interpreter (``SCRIPT`` below), never in the pytest process
itself: the process that forks must be one that has (or has not, for the controls) started the
OpenMP pool, and a child that aborts or hangs must be contained. Every wait has a timeout,
inside the scenario (DataLoader ``timeout``, pool deadline, ``join``) and around it (the
subprocess), and the subprocess gets its own session so that a timeout kills its forked
children too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="fork with an OpenMP runtime: tested on Linux"
)

# Seconds: a scenario's own waits on its children (compiling the kernels cold,
# in each child, fits), and the whole scenario process.
INNER_TIMEOUT = 180
OUTER_TIMEOUT = 300

# The scenario process. argv: scenario ("dataloader", "pool", "child"), library
# ("normlab" or "torch"), and what the parent does before it forks:
#   "pool"       -- runs one large call of each family in `library` (2 torch
#                   threads), so torch's OpenMP pool (which normlab's kernels run
#                   on) has started, and computes its references;
#   "idle"       -- nothing: no large call, no normlab call at all; references
#                   are computed after the children are done;
#   "torch_pool" -- runs the large calls with torch.nn's own layers; normlab's
#                   references after the children.
SCRIPT = r'''
import hashlib
import multiprocessing as mp
import os
import sys
import time

import numpy as np
import torch

SCENARIO, LIB, START = sys.argv[1:4]
INNER_TIMEOUT = float(sys.argv[4])


def library(name):
    if name == "normlab":
        import normlab.nn
        return normlab.nn
    return torch.nn


# (label, class, args, kwargs, input shape). Small: what the children compute;
# some are above normlab's serial threshold (32768 values), so the parent runs
# them in parallel and the one-thread children serially -- the same bits.
SMALL = [
    ("LayerNorm(6) (4, 6)", "LayerNorm", (6,), {}, (4, 6)),
    ("BatchNorm1d(64) train (300, 64)", "BatchNorm1d", (64,), {}, (300, 64)),
    ("GroupNorm(8, 32) (8, 32, 16, 16)", "GroupNorm", (8, 32), {}, (8, 32, 16, 16)),
    ("RMSNorm(512) (32, 10, 512)", "RMSNorm", (512,), {}, (32, 10, 512)),
    ("InstanceNorm2d(16, affine) (8, 16, 16, 16)", "InstanceNorm2d", (16,), {"affine": True},
     (8, 16, 16, 16)),
]
# Large: >= 1M values each, so a parallel region certainly starts (2 threads).
LARGE = [
    ("LayerNorm(1024) (4096, 1024)", "LayerNorm", (1024,), {}, (4096, 1024)),
    ("BatchNorm2d(64) train (32, 64, 32, 32)", "BatchNorm2d", (64,), {}, (32, 64, 32, 32)),
    ("GroupNorm(32, 64) (32, 64, 32, 32)", "GroupNorm", (32, 64), {}, (32, 64, 32, 32)),
]
N_ITEMS = 10  # DataLoader items / pool tasks: item i is SMALL[i % 5] with seed 1000 + i


def inputs(shape, seed):
    """x and dy for a case: torch.normal with a generator -- a serial fill, which
    starts no OpenMP region even for large shapes (so the "idle" parent stays idle)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.normal(0.5, 2.0, shape, generator=g)
    dy = torch.normal(0.0, 1.0, shape, generator=g)
    return x, dy


def run_case(lib, case, seed, x=None, dy=None):
    """Forward and backward of one layer (train mode): output, input and parameter
    gradients, buffers. Fresh layer, parameters drawn from `seed`; no torch op on
    the large tensors besides the layer itself (safe in a forked child)."""
    label, cls, args, kwargs, shape = case
    if x is None:
        x, dy = inputs(shape, seed)
    g = torch.Generator().manual_seed(seed + 1)
    layer = getattr(library(lib), cls)(*args, **kwargs).train()
    params = list(layer.parameters())
    with torch.no_grad():
        for p in params:
            p.copy_(torch.normal(1.0, 0.5, p.shape, generator=g))
    x = x.detach().requires_grad_()  # a fresh leaf on the same storage
    y = layer(x)
    grads = torch.autograd.grad(y, [x, *params], dy)
    out = {"y": y.detach(), "dx": grads[0]}
    out.update({"d" + n: gr for (n, _), gr in zip(layer.named_parameters(), grads[1:])})
    out.update({n: b.detach().clone() for n, b in layer.named_buffers()})
    return out


def digest(t):
    """sha256 of a tensor's values, through numpy (no torch op: safe in a forked child)."""
    a = np.ascontiguousarray(t.detach().numpy())
    return "%s %s %s" % (a.dtype, a.shape, hashlib.sha256(a.tobytes()).hexdigest()[:16])


def compare(label, got, ref, exact):
    """Problems with `got` against `ref` (dicts of tensors)."""
    bad = []
    if sorted(got) != sorted(ref):
        return ["%s: keys %s, parent has %s" % (label, sorted(got), sorted(ref))]
    for k in ref:
        if exact:
            if not torch.equal(got[k], ref[k]):
                diff = (got[k].double() - ref[k].double()).abs().max().item()
                bad.append("%s %s: differs from the parent's (max abs diff %.3g)" % (label, k, diff))
        else:
            try:  # torch's sums may be split by thread: float32 rounding apart
                torch.testing.assert_close(got[k], ref[k], rtol=1e-4, atol=1e-4)
            except AssertionError as e:
                bad.append("%s %s: %s" % (label, k, " ".join(str(e).split())))
    return bad


def say(*a):
    print("[%d] " % os.getpid() + " ".join(str(s) for s in a), flush=True)


def start_parent():
    """The parent's work before forking (see START); returns the large cases' results
    when they were computed with LIB."""
    torch.set_num_threads(2)
    if START == "idle":
        return None
    lib = "torch" if START == "torch_pool" else LIB
    large = {case[0]: run_case(lib, case, 7 + i, *LARGE_INPUTS[case[0]]) for i, case in enumerate(LARGE)}
    say("parent ran the large %s calls" % ("normlab" if lib == "normlab" else "torch.nn"))
    return large if lib == LIB else None


def small_refs():
    return {i: run_case(LIB, SMALL[i % len(SMALL)], 1000 + i) for i in range(N_ITEMS)}


def check_items(items, refs):
    """items: (index, pid, threads, results) from the children."""
    exact = LIB == "normlab"  # normlab's bits never depend on the thread count; torch's may
    bad = []
    seen = sorted(i for i, _, _, _ in items)
    if seen != list(range(N_ITEMS)):
        bad.append("got items %s, expected 0..%d" % (seen, N_ITEMS - 1))
    for i, pid, threads, out in items:
        if pid == os.getpid():
            bad.append("item %d was computed in the parent" % i)
        bad += compare("item %d %s" % (i, SMALL[i % len(SMALL)][0]), out, refs[i], exact)
    say("children (pid: torch threads):", sorted({(pid, threads) for _, pid, threads, _ in items}))
    return bad


# -- scenario "dataloader": DataLoader(num_workers=2, multiprocessing_context="fork")

class Items(torch.utils.data.Dataset):
    def __len__(self):
        return N_ITEMS

    def __getitem__(self, i):
        # the DataLoader worker has called torch.set_num_threads(1) already
        out = run_case(LIB, SMALL[i % len(SMALL)], 1000 + i)
        return i, os.getpid(), torch.get_num_threads(), out


def dataloader():
    start_parent()
    refs = small_refs() if START == "pool" else None
    loader = torch.utils.data.DataLoader(
        Items(), batch_size=None, num_workers=2, multiprocessing_context="fork",
        timeout=INNER_TIMEOUT,
    )
    items = list(loader)  # worker death or hang raises here
    if refs is None:
        refs = small_refs()
    pids = {pid for _, pid, _, _ in items}
    bad = check_items(items, refs)
    if len(pids) != 2:
        bad.append("expected both workers to compute items, got pids %s" % sorted(pids))
    return bad


# -- scenario "pool": multiprocessing.get_context("fork").Pool(2), one torch thread per task

def pool_task(i):
    torch.set_num_threads(1)
    out = run_case(LIB, SMALL[i % len(SMALL)], 1000 + i)
    return i, os.getpid(), torch.get_num_threads(), out


def pool():
    start_parent()
    refs = small_refs() if START == "pool" else None
    ctx = mp.get_context("fork")
    with ctx.Pool(2) as p:
        workers = {c.pid for c in mp.active_children()}  # the pool's two workers
        result = p.map_async(pool_task, range(N_ITEMS), chunksize=1)
        deadline = time.monotonic() + INNER_TIMEOUT
        while not result.ready():
            # a worker that dies takes its task with it: the pool replaces the
            # worker and map would wait forever -- fail at once instead
            gone = workers - {c.pid for c in mp.active_children()}
            if gone:
                raise RuntimeError("pool worker(s) %s died before the map finished" % sorted(gone))
            if time.monotonic() > deadline:
                raise RuntimeError("pool map not done after %d s: hung" % INNER_TIMEOUT)
            result.wait(0.2)
        items = result.get()
    if refs is None:
        refs = small_refs()
    return check_items(items, refs)


# -- scenario "child": a forked child that keeps the parent's thread count (no
# set_num_threads) and runs normlab on small and large inputs. Nothing in the
# child but normlab's layers and serial torch/numpy ops: torch's own OpenMP ops
# hang in such a child, and that is not what this tests.

def child_main(conn):
    say("child: torch threads", torch.get_num_threads())
    out = {}
    for i, case in enumerate(SMALL):
        out[case[0]] = {k: digest(v) for k, v in run_case(LIB, case, 1000 + i).items()}
        say("child: done", case[0])
    for i, case in enumerate(LARGE):
        out[case[0]] = {k: digest(v) for k, v in run_case(LIB, case, 7 + i, *LARGE_INPUTS[case[0]]).items()}
        say("child: done", case[0])
    conn.send(out)
    conn.close()


def child():
    large = start_parent()
    refs = None
    if START == "pool":  # the references come from the very calls that started the pool
        refs = dict(large, **{c[0]: run_case(LIB, c, 1000 + i) for i, c in enumerate(SMALL)})
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=child_main, args=(send,))
    proc.start()
    send.close()
    got = None
    if recv.poll(INNER_TIMEOUT):
        try:
            got = recv.recv()
        except EOFError:  # the child died before sending
            pass
    proc.join(30 if got is not None else 5)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return ["forked child hung: no result after %d s (killed)" % INNER_TIMEOUT]
    if proc.exitcode != 0:
        how = ("killed by signal %d" % -proc.exitcode) if proc.exitcode < 0 else "exit code %d" % proc.exitcode
        return ["forked child died (%s) -- see its stderr" % how]
    if refs is None:
        refs = dict(
            {c[0]: run_case(LIB, c, 7 + i, *LARGE_INPUTS[c[0]]) for i, c in enumerate(LARGE)},
            **{c[0]: run_case(LIB, c, 1000 + i) for i, c in enumerate(SMALL)},
        )
    bad = []
    for label, ref in refs.items():
        want = {k: digest(v) for k, v in ref.items()}
        if got.get(label) != want:
            bad.append("%s: child %s != parent %s" % (label, got.get(label), want))
    return bad


# inputs of the large cases: made once, in the parent, before any fork
LARGE_INPUTS = {case[0]: inputs(case[4], 7 + i) for i, case in enumerate(LARGE)}

bad = {"dataloader": dataloader, "pool": pool, "child": child}[SCENARIO]()
if bad:
    print("FAILED:\n  " + "\n  ".join(bad), flush=True)
    sys.exit(1)
print("OK", flush=True)
'''


def _run_scenario(scenario: str, lib: str, start: str) -> None:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"
    cmd = [sys.executable, "-c", SCRIPT, scenario, lib, start, str(INNER_TIMEOUT)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,  # its own process group: a timeout kills its forked children too
    )
    try:
        out, err = proc.communicate(timeout=OUTER_TIMEOUT)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # leftovers (a hung child), or all of it on timeout
        except (ProcessLookupError, PermissionError):
            pass
    if timed_out:
        out, err = proc.communicate()
    what = f"scenario {scenario!r} with {lib} (parent before fork: {start})"
    log = f"\n--- stdout ---\n{out[-6000:]}\n--- stderr ---\n{err[-6000:]}"
    if timed_out:
        pytest.fail(f"{what}: still running after {OUTER_TIMEOUT} s (hung), killed{log}")
    assert proc.returncode == 0, f"{what}: exit code {proc.returncode}{log}"
    assert out.rstrip().endswith("OK"), f"{what}: no OK at the end{log}"


@pytest.mark.parametrize("start", ["pool", "idle"])
def test_dataloader_fork_workers_run_normlab(start):
    """DataLoader(num_workers=2, fork): each worker (1 torch thread) runs normlab's
    layers forward and backward; the results equal the parent's bit for bit."""
    _run_scenario("dataloader", "normlab", start)


def test_dataloader_fork_workers_run_torch_nn_control():
    """The same harness with torch.nn's layers (parent pool started): passes with or
    without normlab's fix, so a failure of the normlab version is normlab's."""
    _run_scenario("dataloader", "torch", "pool")


@pytest.mark.parametrize("start", ["pool", "idle"])
def test_fork_pool_one_thread_runs_normlab(start):
    """multiprocessing fork Pool(2), tasks with torch.set_num_threads(1): same bits
    as the parent's."""
    _run_scenario("pool", "normlab", start)


@pytest.mark.parametrize("start", ["idle"])
def test_forked_child_with_inherited_threads_runs_normlab(start):
    """A forked child that keeps 2 threads runs normlab on small and large inputs without dying
    or hanging, and gets the parent's bits, when the parent had not started the OpenMP pool
    (with it started, torch's own ops hang such a child as well: see the module docstring)."""
    _run_scenario("child", "normlab", start)
