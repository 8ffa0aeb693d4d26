"""The gate: every public entry (``normlab.functional``, ``normlab.nn``) asks
``normlab._backend.route`` which path it takes, and takes it.

Two behaviours show it from outside, for every entry:

- an explicit ``"cpu"`` on a tensor it cannot serve (a ``meta`` tensor) raises the gate's error;
  an entry that decided its path elsewhere would compute instead;
- under ``"ref"``, not one ``normlab::`` op is dispatched (the reference math is torch ops); under
  ``"auto"`` on a CPU tensor (with the extension installed) the ops dispatched differ from those:
  the kernels run (some through their ``normlab::`` ops, some called directly by the C++ entry,
  which the log does not see), not the reference's torch ops.
"""

from __future__ import annotations

import pytest
import torch

import normlab
import normlab.functional as NF
import normlab.nn as NN
from tests.oracle import ops_dispatched

HAS_CPU = "cpu" in normlab.available_backends()


def _t(*shape, device="cpu"):
    return torch.randn(*shape, device=device) if device == "cpu" else torch.empty(*shape, device=device)


# name -> call(device): each public function once, with arguments it accepts
FUNCTIONS = {
    "layer_norm": lambda d: NF.layer_norm(_t(4, 8, device=d), (8,), _t(8, device=d), _t(8, device=d)),
    "rms_norm": lambda d: NF.rms_norm(_t(4, 8, device=d), (8,), _t(8, device=d)),
    "add_layer_norm": lambda d: NF.add_layer_norm(_t(4, 8, device=d), _t(4, 8, device=d), (8,)),
    "add_rms_norm": lambda d: NF.add_rms_norm(_t(4, 8, device=d), _t(4, 8, device=d), (8,)),
    "batch_norm": lambda d: NF.batch_norm(_t(4, 3, 5, device=d), _t(3, device=d), _t(3, device=d).abs(),
                                          training=True),
    "group_norm": lambda d: NF.group_norm(_t(2, 6, 5, device=d), 3),
    "instance_norm": lambda d: NF.instance_norm(_t(2, 3, 5, device=d)),
    "layer_norm2d": lambda d: NF.layer_norm2d(_t(2, 3, 4, 4, device=d)),
    "batch_renorm": lambda d: NF.batch_renorm(_t(4, 3, device=d), torch.zeros(3, device=d),
                                              torch.ones(3, device=d), training=True),
    "ghost_batch_norm": lambda d: NF.ghost_batch_norm(_t(8, 3, device=d), 4),
    "dyt": lambda d: NF.dyt(_t(4, 8, device=d), (8,), _t(1, device=d), _t(8, device=d), _t(8, device=d)),
    "local_response_norm": lambda d: NF.local_response_norm(_t(2, 5, 4, device=d), 3),
    "rms_norm2d": lambda d: NF.rms_norm2d(_t(2, 3, 4, 4, device=d), _t(3, device=d)),
    "simple_norm": lambda d: NF.simple_norm(_t(4, 8, device=d), (8,), _t(8, device=d)),
    "simple_norm2d": lambda d: NF.simple_norm2d(_t(2, 3, 4, 4, device=d), _t(3, device=d)),
    "filter_response_norm": lambda d: NF.filter_response_norm(_t(2, 3, 4, 4, device=d), _t(3, device=d),
                                                              _t(3, device=d), _t(3, device=d)),
    "evo_norm2d_b0": lambda d: NF.evo_norm2d_b0(_t(2, 3, 4, 4, device=d), torch.ones(3, device=d), v=_t(3, device=d),
                                                training=True),
    "evo_norm2d_s0": lambda d: NF.evo_norm2d_s0(_t(2, 4, 4, 4, device=d), 2, v=_t(4, device=d)),
    "batch_norm_act": lambda d: NF.batch_norm_act(_t(4, 3, 5, device=d), None, None, _t(3, device=d),
                                                  _t(3, device=d), training=True, act="silu"),
    "group_norm_act": lambda d: NF.group_norm_act(_t(2, 6, 5, device=d), 3, act="gelu"),
    "layer_norm_act": lambda d: NF.layer_norm_act(_t(4, 8, device=d), (8,), act="relu"),
    "layer_norm_act2d": lambda d: NF.layer_norm_act2d(_t(2, 3, 4, 4, device=d), act="tanh"),
}

# name -> (module, input shape)
MODULES = {
    "LayerNorm": (lambda: NN.LayerNorm(8), (4, 8)),
    "RMSNorm": (lambda: NN.RMSNorm(8), (4, 8)),
    "BatchNorm1d": (lambda: NN.BatchNorm1d(3), (4, 3)),
    "BatchNorm2d": (lambda: NN.BatchNorm2d(3), (2, 3, 4, 4)),
    "BatchNorm3d": (lambda: NN.BatchNorm3d(3), (2, 3, 2, 2, 2)),
    "FrozenBatchNorm1d": (lambda: NN.FrozenBatchNorm1d(3), (4, 3)),
    "FrozenBatchNorm2d": (lambda: NN.FrozenBatchNorm2d(3), (2, 3, 4, 4)),
    "FrozenBatchNorm3d": (lambda: NN.FrozenBatchNorm3d(3), (2, 3, 2, 2, 2)),
    "GroupNorm": (lambda: NN.GroupNorm(2, 4), (2, 4, 5)),
    "InstanceNorm1d": (lambda: NN.InstanceNorm1d(3, affine=True, track_running_stats=True), (2, 3, 5)),
    "InstanceNorm2d": (lambda: NN.InstanceNorm2d(3), (2, 3, 4, 4)),
    "InstanceNorm3d": (lambda: NN.InstanceNorm3d(3), (2, 3, 2, 2, 2)),
    "SyncBatchNorm": (lambda: NN.SyncBatchNorm(3), (4, 3, 5)),
    "LayerNorm2d": (lambda: NN.LayerNorm2d(3), (2, 3, 4, 4)),
    "BatchRenorm1d": (lambda: NN.BatchRenorm1d(3), (4, 3)),
    "BatchRenorm2d": (lambda: NN.BatchRenorm2d(3), (2, 3, 4, 4)),
    "BatchRenorm3d": (lambda: NN.BatchRenorm3d(3), (2, 3, 2, 2, 2)),
    "GhostBatchNorm1d": (lambda: NN.GhostBatchNorm1d(3, virtual_batch_size=2), (4, 3)),
    "GhostBatchNorm2d": (lambda: NN.GhostBatchNorm2d(3, virtual_batch_size=2), (4, 3, 2, 2)),
    "GhostBatchNorm3d": (lambda: NN.GhostBatchNorm3d(3, virtual_batch_size=2), (4, 3, 2, 2, 2)),
    "DyT": (lambda: NN.DyT(8), (4, 8)),
    # the Lazy modules: the first call materialises them, then runs their normlab class's forward
    "LazyBatchNorm1d": (lambda: NN.LazyBatchNorm1d(), (4, 3)),
    "LazyBatchNorm2d": (lambda: NN.LazyBatchNorm2d(), (2, 3, 4, 4)),
    "LazyBatchNorm3d": (lambda: NN.LazyBatchNorm3d(), (2, 3, 2, 2, 2)),
    "LazyInstanceNorm1d": (lambda: NN.LazyInstanceNorm1d(), (2, 3, 5)),
    "LazyInstanceNorm2d": (lambda: NN.LazyInstanceNorm2d(), (2, 3, 4, 4)),
    "LazyInstanceNorm3d": (lambda: NN.LazyInstanceNorm3d(), (2, 3, 2, 2, 2)),
    "LocalResponseNorm": (lambda: NN.LocalResponseNorm(3), (2, 5, 4, 4)),
    "CrossMapLRN2d": (lambda: NN.CrossMapLRN2d(3), (2, 5, 4, 4)),
    "RmsNorm2d": (lambda: NN.RmsNorm2d(3), (2, 3, 4, 4)),
    "SimpleNorm": (lambda: NN.SimpleNorm(8), (4, 8)),
    "SimpleNorm2d": (lambda: NN.SimpleNorm2d(3), (2, 3, 4, 4)),
    "FilterResponseNormTlu2d": (lambda: NN.FilterResponseNormTlu2d(3), (2, 3, 4, 4)),
    "FilterResponseNormAct2d": (lambda: NN.FilterResponseNormAct2d(3), (2, 3, 4, 4)),
    "EvoNorm2dB0": (lambda: NN.EvoNorm2dB0(3), (2, 3, 4, 4)),
    "EvoNorm2dS0": (lambda: NN.EvoNorm2dS0(4, groups=2), (2, 4, 4, 4)),
    "BatchNormAct2d": (lambda: NN.BatchNormAct2d(3, act_layer="silu"), (2, 3, 4, 4)),
    "FrozenBatchNormAct2d": (lambda: NN.FrozenBatchNormAct2d(3), (2, 3, 4, 4)),
    "GroupNormAct": (lambda: NN.GroupNormAct(4, 2), (2, 4, 5)),
    "LayerNormAct": (lambda: NN.LayerNormAct(8, act_layer="gelu"), (4, 8)),
    "LayerNormAct2d": (lambda: NN.LayerNormAct2d(3), (2, 3, 4, 4)),
}
# Entries whose every path runs the reference math (no C++ kernel): "auto" runs what "ref" runs
REFERENCE_ONLY: set[str] = {"local_response_norm", "LocalResponseNorm", "CrossMapLRN2d", "simple_norm",
                            "evo_norm2d_b0", "evo_norm2d_s0", "SimpleNorm", "EvoNorm2dB0", "EvoNorm2dS0"}


def _module_call(name, device, training=True):
    make, shape = MODULES[name]
    m = make().to(device).train(training)
    x = _t(*shape, device=device)
    return lambda: m(x)


def test_the_tables_cover_every_public_entry():
    assert set(FUNCTIONS) == set(NF.__all__)
    assert set(MODULES) == set(NN.__all__)


CASES = [("function", n, None) for n in FUNCTIONS] + [
    ("module", n, t) for n in MODULES for t in (True, False)]


def _call(kind, name, training, device):
    return (lambda: FUNCTIONS[name](device)) if kind == "function" else _module_call(name, device, training)


@pytest.mark.skipif(not HAS_CPU, reason="the C++ extension is not installed")
@pytest.mark.parametrize("kind,name,training", CASES)
def test_every_entry_asks_the_gate(kind, name, training):
    call = _call(kind, name, training, "meta")
    with normlab.use_backend("cpu"):
        with pytest.raises(RuntimeError, match=r"backend 'cpu' cannot serve a torch.float32 tensor on meta"):
            call()


@pytest.mark.parametrize("kind,name,training", CASES)
def test_every_entry_takes_the_path_the_gate_gives(kind, name, training):
    torch.manual_seed(0)
    with normlab.use_backend("ref"):
        ref_ops, err = ops_dispatched(_call(kind, name, training, "cpu"))
    assert err is None
    assert ref_ops and not [op for op in ref_ops if op.startswith("normlab.")], ref_ops
    if HAS_CPU and name not in REFERENCE_ONLY:
        torch.manual_seed(0)
        with normlab.use_backend("auto"):
            ops, err = ops_dispatched(_call(kind, name, training, "cpu"))
        assert err is None
        assert ops != ref_ops
