"""Partial participation: strategy.fraction samples clients per round; errors stay over all."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fnsysid.app.experiment import run_experiment
from fnsysid.dynamics.model import generate
from fnsysid.learning.optim import GD, gd_steps, step_sizes
from fnsysid.learning.strategies import FedAvg, FedNova, Scaffold
from tests.conftest import compose_cfg, make


def _setup(strategy, M=6, K=3, lr=0.02, seed=0):
    _, model, *_ = make("system=synthetic")
    d = generate(model, M=M, N=3, T=5, eps=0.2, repeats=2, seed=1)
    strategy.setup(np.zeros((2, model.p)), d, model, GD(reduction="mean"), K, lr, seed)
    return model, d


def test_sampling_is_seeded_per_round_and_repeat_with_the_requested_share():
    s = FedAvg(fraction=0.5)
    _setup(s, M=6)
    masks = [s.participants(r) for r in range(1, 9)]
    assert all(m.shape == (2, 6) and (m.sum(axis=1) == 3).all() for m in masks)
    assert any((a != b).any() for a, b in zip(masks, masks[1:], strict=False))  # rounds differ
    assert any((m[0] != m[1]).any() for m in masks)                            # repeats differ
    again = FedAvg(fraction=0.5)
    _setup(again, M=6)
    assert all((again.participants(r) == masks[r - 1]).all() for r in range(1, 9))
    other = FedAvg(fraction=0.5)
    _setup(other, M=6, seed=3)
    assert any((other.participants(r) != masks[r - 1]).any() for r in range(1, 9))
    assert FedAvg().participants(1) is None
    tiny = FedAvg(fraction=0.01)
    _setup(tiny, M=6)
    assert (tiny.participants(1).sum(axis=1) == 1).all()                  # at least one client


def test_fedavg_round_averages_the_sampled_clients_only():
    s = FedAvg(fraction=0.5)
    model, d = _setup(s, M=6, K=3, lr=0.02)
    theta = s.server.copy()
    mask = s.participants(1)
    s.round(1)
    for rep in range(2):
        idx = np.flatnonzero(mask[rep])
        local = gd_steps(np.broadcast_to(theta[rep], (len(idx), model.p)), d.H[rep, idx],
                         d.b[rep, idx], d.n[rep, idx], step_sizes(0.02, 3), reduction="mean")
        np.testing.assert_allclose(s.server[rep], local.mean(axis=0), rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("strategy", [Scaffold, FedNova])
def test_partial_participation_keeps_the_strategy_invariants(strategy):
    s = strategy(fraction=0.5)
    _setup(s, M=6)
    for r in range(1, 30):
        s.round(r)
    assert np.isfinite(s.server).all()
    if strategy is Scaffold:      # c stays the mean of all clients' c_i; only sampled ones move
        np.testing.assert_allclose(s.c, s.clients.state["c_i"].mean(axis=1), atol=1e-12)


def test_fraction_run_writes_errors_over_all_clients(tmp_path):
    cfg = compose_cfg("system=synthetic", "M=8", "R=20", "repeats=2", "strategy.fraction=0.25",
                      "output.plot=false")
    run_experiment(cfg, tmp_path)
    clients = pd.read_csv(tmp_path / "clients.csv")
    assert clients.groupby(["repeat", "round"]).size().eq(8).all()
    e = pd.read_csv(tmp_path / "errors.csv").groupby("repeat")["e_max"]
    assert (e.last() < e.first()).all()
