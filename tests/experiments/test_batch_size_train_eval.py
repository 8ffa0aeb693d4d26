"""batch-size and train-eval: their numbers against plain torch.nn recomputations."""

import copy

import pytest
import torch
import torch.nn.functional as F

from normlab.experiments import batch_size as B
from normlab.experiments import train_eval as TE
from normlab.experiments._mlp import chapter_mlp, moons, train_loop


def _torch_cnn(norm, seed):
    """The same CNN with torch.nn's layers (drawn in the same order after the same seed)."""
    torch.manual_seed(seed)
    nn = torch.nn
    mk = {"batch": lambda c: nn.BatchNorm2d(c), "group": lambda c: nn.GroupNorm(4, c),
          "layer": lambda c: nn.GroupNorm(1, c), "none": lambda c: nn.Identity()}[norm]
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), mk(16), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), mk(32),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(512, 10))


def _torch_run(norm, batch, seed, epochs):
    Xtr, ytr, Xte, yte = B.digits()
    model = _torch_cnn(norm, seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.02 * batch / 32, momentum=0.9)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        model.train()
        perm = torch.randperm(len(Xtr), generator=gen)
        for i in range(0, len(Xtr) - batch + 1, batch):
            idx = perm[i:i + batch]
            opt.zero_grad()
            F.cross_entropy(model(Xtr[idx]), ytr[idx]).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        return (model(Xte).argmax(1) == yte).float().mean().item()


def test_digits_split():
    Xtr, ytr, Xte, yte = B.digits()
    assert len(Xtr) == B.N_TRAIN == 1257 and len(Xte) == 540
    assert Xtr.shape[1:] == (1, 8, 8) and 0 <= Xtr.min() and Xtr.max() <= 1


@pytest.mark.parametrize("norm, batch", [("batch", 16), ("group", 64)])
def test_batch_size_run_matches_torch_nn(norm, batch, tmp_path):
    r = B.run(norms=[norm], batch_sizes=[batch], seeds=1, epochs=1, store=str(tmp_path / "r.sqlite"))
    (cell,) = r["cells"]
    # normlab's norms sum in another order than torch's; over one epoch that moves
    # at most a test sample or two (measured: 0 or 1 of 540)
    assert abs(cell["mean"] - _torch_run(norm, batch, 0, 1)) <= 3 / 540
    assert cell["mean"] > 0.5


def test_verdict_reads_the_shape_both_ways():
    def cells(bn_small, gn_small, bn_large=0.95, gn_large=0.95, std=0.005):
        return {("batch", 2): {"mean": bn_small, "std": std}, ("group", 2): {"mean": gn_small, "std": std},
                ("batch", 128): {"mean": bn_large, "std": std}, ("group", 128): {"mean": gn_large, "std": std}}
    assert "Same shape as Wu & He" in B.verdict(cells(0.80, 0.95), [2, 128])
    assert "+15.0 accuracy points" in B.verdict(cells(0.80, 0.95), [2, 128])
    assert "Not Wu & He's shape" in B.verdict(cells(0.95, 0.95), [2, 128])
    assert "Not Wu & He's shape" in B.verdict(cells(0.90, 0.95, std=0.08), [2, 128])     # within noise
    assert "not run" in B.verdict({}, [2, 128])


@pytest.fixture(scope="module")
def te(tmp_path_factory):
    store = tmp_path_factory.mktemp("te") / "r.sqlite"
    return TE.run(norms="batch,layer", seeds=2, store=str(store))


def _rows(te, norm):
    return {r["mode"]: r for r in te["rows"] if r["norm"] == norm}


def test_train_eval_batchnorm(te):
    rows = _rows(te, "batch")
    assert rows["train b=1"]["failed"] == 2
    assert rows["train b=1"]["errors"] == [
        "ValueError: Expected more than 1 value per channel when training, got input size torch.Size([1, 64])"]
    assert "error (2 of 2 runs): ValueError: Expected more than 1 value per channel" in TE.render(te)
    # Oracle: the chapter's torch.nn model, trained by the chapter's loop, evaluated here.
    X, y = moons()
    Xt, yt = moons(1000, 0.30, 7)
    want = {m: [] for m in ("eval mode", "train b=2", "train b=full")}
    for seed in te["seeds"]:
        model = chapter_mlp("batch", seed)
        train_loop(model, X, y, 0.3)
        with torch.no_grad():
            want["eval mode"].append((model(Xt).argmax(1) == yt).float().mean().item())
            m = copy.deepcopy(model).train()
            pairs = torch.cat([m(Xt[i:i + 2]) for i in range(0, 1000, 2)])
            want["train b=2"].append((pairs.argmax(1) == yt).float().mean().item())
            m = copy.deepcopy(model).train()
            want["train b=full"].append((m(Xt).argmax(1) == yt).float().mean().item())
    for mode, accs in want.items():
        assert rows[mode]["acc_mean"] == pytest.approx(sum(accs) / len(accs), abs=3 / 1000)
    # forgetting model.eval() costs accuracy at small batches
    assert rows["train b=2"]["acc_mean"] < rows["eval mode"]["acc_mean"] - 0.05


def test_train_eval_layernorm_does_not_care(te):
    rows = _rows(te, "layer")
    accs = {r["acc_mean"] for r in rows.values()}
    assert len(accs) == 1 and not any(r["failed"] for r in rows.values())
    assert max(r["max_logit_diff"] for r in rows.values()) < 1e-5
