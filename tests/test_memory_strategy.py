"""The memory estimates of simulated and file data count the same per-client arrays for a
strategy: ``(1 + client_matrices) p^2`` values (3 p^2 federated, 1 p^2 for
``centralized_exact``), the training values, and for file data the held-out statistics on
top."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fnsysid.app.build import build
from fnsysid.app.resources import TEMPORARIES, estimate_bytes, estimate_file_bytes
from fnsysid.data.files import write_client_files
from fnsysid.data.memory import built_bytes
from fnsysid.data.source import from_files
from fnsysid.dynamics.model import factor_terms
from tests.conftest import compose_cfg

STRATEGIES = ["fedavg", "oneshot", "centralized_exact"]
#: p x p arrays per client: the Gram matrix and the strategy's client_matrices
MATRICES = {"fedavg": 3, "oneshot": 3, "centralized_exact": 1}


def per_client_bytes(strategy: str):
    """Bytes per client and repeat of the simulated estimate (the slope in M above one block
    of clients, no held-out trajectories) and of the file estimate once read (the slope of
    ``built_bytes`` in M, no samples), and the model."""
    def sim(M):
        cfg = compose_cfg("system=synthetic", f"strategy={strategy}", f"M={M}", "repeats=1",
                          "data.val_N=0")
        model, opt, strat = build(cfg)
        return estimate_bytes(cfg, model, opt, False, strat), model, strat

    (a, model, strat), (b, _, _) = sim(100000), sim(200000)
    files = [built_bytes(model, 0, 0, 1, M, np.zeros(M, int), False, [], strat)
             for M in (100000, 200000)]
    return (b - a) / 100000, (files[1] - files[0]) / 100000, model


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_file_and_simulated_estimates_count_the_same_matrices_per_strategy(strategy):
    sim, files, model = per_client_bytes(strategy)
    p, (n_y, n_phi) = model.p, model.structure.shape[:2]
    # the documented count: (1 + client_matrices) p^2 + 10 p + 10 + means + QR factors,
    # float64, doubled for temporaries
    values = MATRICES[strategy] * p * p + 10 * p + 10 + n_phi + n_y + factor_terms(model)
    assert sim == TEMPORARIES * 8 * values
    # file data hold the held-out statistics on top, whatever the strategy
    assert files - sim == TEMPORARIES * 8 * (2 * n_phi * n_phi + 3 * n_y * n_phi)


@pytest.mark.slow
def test_the_strategy_reaches_the_file_estimates(tmp_path):
    """Before the files are read (estimate_file_bytes) and once read (from_files' budget):
    centralized_exact's estimate is 2 p^2 values a client below fedavg's, oneshot's equals
    it."""
    rng = np.random.default_rng(0)
    M, L = 5, 30
    rows = pd.DataFrame({"client": np.repeat([f"c{c}" for c in range(M)], 2 * L),
                         "trajectory": np.tile(np.repeat([0, 1], L), M),
                         "t": np.tile(np.arange(L), 2 * M),
                         "x1": rng.normal(size=2 * L * M), "x2": rng.normal(size=2 * L * M),
                         "u": rng.normal(size=2 * L * M)})
    write_client_files(rows, tmp_path / "fleet")
    before, once_read = {}, {}
    for strategy in STRATEGIES:
        cfg = compose_cfg("system=generic", "data=files", f"data.path={tmp_path / 'fleet'}",
                          "data.states=[x1,x2]", "data.inputs=[u]", f"strategy={strategy}")
        model, opt, strat = build(cfg)
        before[strategy] = estimate_file_bytes(cfg, model, strat)[0]
        seen = []
        from_files(cfg, model, opt, budget=lambda need, what, seen=seen: seen.append(need),
                   strategy=strat)
        once_read[strategy] = seen[0]
    p = model.p
    for got in (before, once_read):
        assert got["fedavg"] - got["centralized_exact"] == TEMPORARIES * 8 * M * 2 * p * p
        assert got["oneshot"] == got["fedavg"]
