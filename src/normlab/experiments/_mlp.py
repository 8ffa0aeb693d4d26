"""The BatchNorm chapter's MLP: its data, its plain training loop, and many of it at once.

- :func:`moons`, :func:`chapter_mlp`, :func:`train_loop`: the chapter's
  ``mlp_dengan_tanpa_batchnorm.py`` (make_moons 300 points, MLP [2, 64, 64, 64, 2] with
  Tanh, the norm after each hidden Linear and before Tanh, full-batch SGD on
  cross-entropy, evaluation in eval mode on the same 300 points).
- :class:`BatchedMLP`, :func:`train_batched`: M copies of that MLP ("members", each with
  its own weight seed and learning rate) trained as one model: stacked weights and
  batched matmuls (``torch.bmm``, then the bias added in place: cheaper than
  ``torch.baddbmm``'s broadcast bias), so that one Python step trains every member.
  The members never mix: each has its own weights, statistics and loss; the gradient
  of the summed loss with respect to a member's weights is that member's own gradient.

  Norms in the batched model, all from ``normlab.nn``:

  ``batch``  ``BatchNorm1d(M*64)`` over the activations laid out as (1, M*64, N): a
             channel per member and unit, so each member gets its own batch statistics
             and running statistics.
  ``layer``  ``normlab.functional.layer_norm`` over the last dim with the member's own
             weight and bias, through ``torch.func.vmap`` over the stacked (M, 64)
             weights: one kernel call, the weights grouped per member inside it.
  ``rms``    ``normlab.functional.rms_norm`` the same way, with the member's own weight.
  ``group``  ``GroupNorm(8, 64, affine=False)`` on the (rows, 64) view, then the member's
             own weight and bias (8 groups of 8 units per member).
  ``dyt``    ``normlab.functional.dyt`` (DyT, no statistic: ``tanh(alpha * h) * w + b``)
             with the member's own alpha (the paper's alpha_init 0.5), weight and bias,
             through ``torch.func.vmap`` as ``layer`` (vmap takes DyT's reference path,
             torch ops with the hand-written backward).

Subnormal floats: a member that diverges (lr 2 or 4 without a norm, say) drives its
softmax and gradients to values below 1.2e-38, and every operation that meets them on
x86 takes a microcode assist, many times slower than the same operation on normal floats.
:func:`train_batched` therefore trains with subnormals flushed to zero
(``torch.set_flush_denormal``, on the calling thread) by default. A run that never meets
a subnormal is bit for bit the same either way; one that does differs from the unflushed
run in values below 1.2e-38 (invisible in its losses, unless the run is chaotic, where
float rounding alone already moves it). The study records this in each run's configuration.

Member ``m`` starts from exactly the weights ``torch.manual_seed(seed_m)`` followed by
:func:`chapter_mlp` gives (the norm layers draw no random numbers), so seed 123 is the
chapter's model.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Sequence

import torch
import torch.nn.functional as F

import normlab.nn
import normlab.functional as NF

NORMS = ("none", "batch", "layer", "rms", "group", "dyt")
WIDTHS = (2, 64, 64, 64, 2)
GROUPS = 8           # GroupNorm(8, 64): 8 units per group
EPOCHS = 30
CHAPTER_SEED = 123
DIVERGE_FACTOR = 10.0
N_EVAL = 300         # the moons: the chapter trains and evaluates on the same 300 points


def moons(n_samples: int = 300, noise: float = 0.30, random_state: int = 42) -> tuple[torch.Tensor, torch.Tensor]:
    """``make_moons`` as the chapter draws it: X float32 (n, 2), y int64 (n,)."""
    from sklearn.datasets import make_moons
    X, y = make_moons(n_samples=n_samples, noise=noise, random_state=random_state)
    return torch.tensor(X, dtype=torch.float32), torch.tensor(y, dtype=torch.long)


def norm_layer(layers, norm: str, width: int) -> torch.nn.Module:
    """The norm ``norm`` of width ``width`` from ``layers`` (``torch.nn`` or ``normlab.nn``)."""
    if norm == "batch":
        return layers.BatchNorm1d(width)
    if norm == "layer":
        return layers.LayerNorm(width)
    if norm == "rms":
        return layers.RMSNorm(width)
    if norm == "group":
        return layers.GroupNorm(GROUPS, width)
    if norm == "dyt":  # torch.nn has none: DyT in torch ops, the paper's module
        return layers.DyT(width) if hasattr(layers, "DyT") else TorchDyT(width)
    raise ValueError(f"unknown norm {norm!r}; known norms are {', '.join(NORMS)}")


class TorchDyT(torch.nn.Module):
    """DyT as the paper writes it, in torch ops: ``tanh(alpha * x) * weight + bias``, alpha
    one learned scalar starting at 0.5 (the chapter's loop runs it where torch.nn has no DyT)."""

    def __init__(self, width: int, alpha_init: float = 0.5) -> None:
        super().__init__()
        self.alpha = torch.nn.Parameter(torch.full((1,), alpha_init))
        self.weight = torch.nn.Parameter(torch.ones(width))
        self.bias = torch.nn.Parameter(torch.zeros(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.alpha * x) * self.weight + self.bias


def chapter_mlp(norm: str = "batch", seed: int = CHAPTER_SEED, layers=torch.nn) -> torch.nn.Sequential:
    """``torch.manual_seed(seed)``, then the chapter's MLP with ``norm`` before each Tanh."""
    torch.manual_seed(seed)
    mods: list[torch.nn.Module] = []
    for i, o in zip(WIDTHS[:-2], WIDTHS[1:-1]):
        mods.append(torch.nn.Linear(i, o))
        if norm != "none":
            mods.append(norm_layer(layers, norm, o))
        mods.append(torch.nn.Tanh())
    return torch.nn.Sequential(*mods, torch.nn.Linear(WIDTHS[-2], WIDTHS[-1]))


def diverged(train_loss: Sequence[float], eval_loss: float) -> bool:
    """The old rule, kept for stores written with it: NaN/inf anywhere, or the last
    training loss above 10x the first. The study now counts :func:`failure` instead."""
    values = torch.tensor(list(train_loss) + [eval_loss], dtype=torch.float64)
    return bool(not torch.isfinite(values).all() or train_loss[-1] > DIVERGE_FACTOR * train_loss[0])


def chance_limit(n_eval: int = N_EVAL) -> float:
    """The highest accuracy still "no better than chance" on ``n_eval`` points of two equal
    classes: 0.5 plus two standard errors of a coin flip, 0.5 + 2 * sqrt(0.25 / n_eval)
    (0.558 for the 300 moons; a coin-flip classifier exceeds it about 2.5 % of the time)."""
    return 0.5 + 2.0 * math.sqrt(0.25 / n_eval)


FAILURE_RULE = ("a run failed to train when its loss became NaN/inf, or its final eval accuracy is no better "
                f"than chance (at most {chance_limit():.3f}: 0.5 plus two standard errors of a coin flip over "
                f"the {N_EVAL} points), or its last training loss is not below its first")


def failure(train_loss: Sequence[float], eval_loss, eval_acc) -> str | None:
    """Why a run failed to train, or None when it trained (:data:`FAILURE_RULE`):
    ``"non-finite"`` (a NaN/inf loss), ``"chance"`` (final eval accuracy at most
    :func:`chance_limit`), or ``"loss"`` (the last training loss not below the first);
    the first that applies, in that order."""
    values = list(train_loss) + [eval_loss, eval_acc]
    if any(v is None or not math.isfinite(v) for v in values):
        return "non-finite"
    if eval_acc <= chance_limit():
        return "chance"
    if not train_loss[-1] < train_loss[0]:
        return "loss"
    return None


def run_failure(record: dict) -> str | None:
    """:func:`failure` of a stored run (its loss curve and final metrics), whatever rule
    was in force when it was stored."""
    f = record["final"]
    return failure(record["epochs"]["train_loss"], f.get("eval_loss"), f.get("eval_acc"))


def train_loop(model: torch.nn.Module, X: torch.Tensor, y: torch.Tensor, lr: float,
               epochs: int = EPOCHS) -> dict:
    """The chapter's ``latih``: full-batch SGD, ``model.train()`` every epoch, then eval
    mode on the same data. ``train_loss[e]`` is the loss of epoch e+1 (before its step)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    criterion = torch.nn.CrossEntropyLoss()
    losses = []
    for _ in range(epochs):
        model.train()
        optimizer.zero_grad()
        loss = criterion(model(X), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        logits = model(X)
        eval_loss = criterion(logits, y).item()
        eval_acc = (logits.argmax(dim=1) == y).float().mean().item()
    return {"train_loss": losses, "eval_loss": eval_loss, "eval_acc": eval_acc}


class BatchedMLP(torch.nn.Module):
    """M chapter MLPs with one norm, trained as one model. See the module docstring."""

    def __init__(self, norm: str, seeds: Sequence[int]) -> None:
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"unknown norm {norm!r}; known norms are {', '.join(NORMS)}")
        protos = [chapter_mlp(norm, s) for s in seeds]
        self.norm, self.members, self.width = norm, len(seeds), WIDTHS[1]
        M, C = self.members, self.width
        linears = [[m for m in p if isinstance(m, torch.nn.Linear)] for p in protos]
        stack = lambda get: torch.nn.Parameter(torch.stack([get(ls) for ls in linears]).detach().clone())
        self.weight = torch.nn.ParameterList([stack(lambda ls, k=k: ls[k].weight) for k in range(len(WIDTHS) - 1)])
        self.bias = torch.nn.ParameterList([stack(lambda ls, k=k: ls[k].bias) for k in range(len(WIDTHS) - 1)])
        hidden = len(WIDTHS) - 2
        self.norms = torch.nn.ModuleList()
        self.norm_weight = torch.nn.ParameterList()
        self.norm_bias = torch.nn.ParameterList()
        self.norm_alpha = torch.nn.ParameterList()
        if norm == "none":
            return
        proto_norms = [[m for m in p if not isinstance(m, (torch.nn.Linear, torch.nn.Tanh))] for p in protos]
        for k in range(hidden):
            w = torch.stack([ns[k].weight for ns in proto_norms]).detach().clone()          # (M, C)
            b = (torch.stack([ns[k].bias for ns in proto_norms]).detach().clone()
                 if getattr(proto_norms[0][k], "bias", None) is not None else None)
            if norm == "batch":
                bn = normlab.nn.BatchNorm1d(M * C)
                with torch.no_grad():
                    bn.weight.copy_(w.reshape(-1))
                    bn.bias.copy_(b.reshape(-1))
                self.norms.append(bn)
                continue
            if norm == "group":
                self.norms.append(normlab.nn.GroupNorm(GROUPS, C, affine=False))
            if norm == "dyt":
                self.norm_alpha.append(torch.nn.Parameter(torch.stack([ns[k].alpha for ns in proto_norms])
                                                          .detach().clone()))               # (M, 1)
            self.norm_weight.append(torch.nn.Parameter(w))
            if b is not None:
                self.norm_bias.append(torch.nn.Parameter(b))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, 2), shared by every member -> logits (M, N, 2)."""
        return self._forward_mcn(x) if self.norm == "batch" else self._forward_mnc(x)

    def _forward_mcn(self, x: torch.Tensor) -> torch.Tensor:
        # BatchNorm: activations as (M, C, N), a row of N points per member and unit, so
        # that BatchNorm1d(M*C) reads them as one (1, M*C, N) batch: statistics over the
        # N points of each row, and no copy between the layers.
        N, M, C = x.shape[0], self.members, self.width
        h = torch.addmm(self.bias[0].reshape(-1, 1), self.weight[0].reshape(M * C, -1), x.t())   # (M*C, N)
        a = torch.tanh(self.norms[0](h.unsqueeze(0))).view(M, C, N)
        last = len(self.weight) - 1
        for k in range(1, last):
            h = torch.bmm(self.weight[k], a).add_(self.bias[k].unsqueeze(2))                       # (M, C, N)
            a = torch.tanh(self.norms[k](h.view(1, M * C, N))).view(M, C, N)
        return torch.bmm(self.weight[last], a).add_(self.bias[last].unsqueeze(2)).transpose(1, 2)  # (M, N, 2)

    def _row_norm(self, h: torch.Tensor, k: int) -> torch.Tensor:
        """LayerNorm / RMSNorm / DyT of each member's (N, C) rows with its own weight (and bias):
        vmap over the members, so the kernel gets the stacked weights (see the module docstring)."""
        C = self.width
        if self.norm == "dyt":
            return torch.func.vmap(lambda hm, a, w, b: NF.dyt(hm, (C,), a, w, b))(
                h, self.norm_alpha[k], self.norm_weight[k], self.norm_bias[k])
        if self.norm == "layer":
            return torch.func.vmap(lambda hm, w, b: NF.layer_norm(hm, (C,), w, b))(
                h, self.norm_weight[k], self.norm_bias[k])
        return torch.func.vmap(lambda hm, w: NF.rms_norm(hm, (C,), w))(h, self.norm_weight[k])

    def _forward_mnc(self, x: torch.Tensor) -> torch.Tensor:
        # The other norms work on the last dim: activations as (M, N, C).
        N, M, C = x.shape[0], self.members, self.width
        a = x.expand(M, N, x.shape[1])
        last = len(self.weight) - 1
        for k in range(last):
            h = torch.bmm(a, self.weight[k].transpose(1, 2)).add_(self.bias[k].unsqueeze(1))      # (M, N, C)
            if self.norm in ("layer", "rms", "dyt"):
                h = self._row_norm(h, k)
            elif self.norm == "group":
                h = self.norms[k](h.view(M * N, C)).view(M, N, C)
                # h * w + b in one pass (torch.addcmul): ~0.4 ms less per layer at 50 members
                h = torch.addcmul(self.norm_bias[k].unsqueeze(1), h, self.norm_weight[k].unsqueeze(1))
            a = torch.tanh(h)
        return torch.bmm(a, self.weight[last].transpose(1, 2)).add_(self.bias[last].unsqueeze(1))  # (M, N, 2)


@contextlib.contextmanager
def subnormals_flushed(on: bool = True):
    """Flush subnormal floats to zero in the block (on this thread; off again after it)."""
    if not on:
        yield
        return
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def _member_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each member, averaged over the samples: (M,)."""
    M, N = logits.shape[:2]
    return F.cross_entropy(logits.reshape(M * N, -1), y.repeat(M), reduction="none").view(M, N).mean(1)


def train_batched(norm: str, members: Sequence[tuple[float, int]], X: torch.Tensor, y: torch.Tensor,
                  epochs: int = EPOCHS, flush_subnormals: bool = True) -> list[dict]:
    """Train one member per ``(lr, seed)`` as one :class:`BatchedMLP`; a result per member,
    as :func:`train_loop` gives it, plus ``diverged`` and ``wall_s`` (the batch's time
    divided by the number of members). Subnormals are flushed to zero unless
    ``flush_subnormals=False`` (see the module docstring)."""
    with subnormals_flushed(flush_subnormals):
        return _train_batched(norm, members, X, y, epochs)


def _train_batched(norm, members, X, y, epochs) -> list[dict]:
    t0 = time.perf_counter()
    lrs = [lr for lr, _ in members]
    model = BatchedMLP(norm, [s for _, s in members])
    M = len(members)
    lr = torch.tensor(lrs, dtype=torch.float32)
    params = list(model.parameters())
    # each parameter's learning rates, broadcast over its member dimension
    steps = [lr.repeat_interleave(p.shape[0] // M).view(-1, *[1] * (p.dim() - 1)) for p in params]
    losses = torch.empty(M, epochs)
    for e in range(epochs):
        model.train()
        loss = _member_loss(model(X), y)
        grads = torch.autograd.grad(loss.sum(), params)
        with torch.no_grad():
            for p, g, s in zip(params, grads, steps):
                p.addcmul_(g, s, value=-1.0)        # SGD: p <- p - lr * grad, per member
        losses[:, e] = loss.detach()
    model.eval()
    with torch.no_grad():
        logits = model(X)
        eval_loss = _member_loss(logits, y)
        eval_acc = (logits.argmax(dim=2) == y).float().mean(1)
    wall = (time.perf_counter() - t0) / M
    out = []
    for m in range(M):
        tl = losses[m].tolist()
        out.append({"train_loss": tl, "eval_loss": eval_loss[m].item(), "eval_acc": eval_acc[m].item(),
                    "diverged": diverged(tl, eval_loss[m].item()),
                    "failure": failure(tl, eval_loss[m].item(), eval_acc[m].item()), "wall_s": wall})
    return out
