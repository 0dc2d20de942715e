"""Confidence intervals of least-squares estimates: one residual variance per regression
target, and on a sparse model's kept terms only."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import fnsysid
from fnsysid.app.build import build
from fnsysid.dynamics.features import Polynomial
from fnsysid.dynamics.model import ClientData, ragged_stats
from fnsysid.learning import personalize as pers
from fnsysid.results.personal import own_intervals, target_stats
from tests.conftest import compose_cfg
from tests.test_sparsity import TRUE, duffing_fleet

DT, K, C, BETA = 0.05, 1.1, 0.3, 0.5


def test_ci_method_names_only_the_intervals_the_run_has():
    from fnsysid.results.personal import CI_METHODS, ci_method

    assert ci_method(None, None) == "no intervals in this run (ci.estimates says why)"
    one = ci_method("oneshot", None)
    assert one == CI_METHODS["oneshot"] + "; " + CI_METHODS["least squares"]
    nan = np.full((1, 2, 3), np.nan)
    per = type("P", (), {"local_se": np.ones((1, 2, 3)), "se": nan, "option": "auto"})()
    both = ci_method("pooled", per).split("; ")
    assert both == [CI_METHODS[k] for k in ("pooled", "local", "least squares")]  # se all NaN
    per.se = np.ones((1, 2, 3))
    assert ci_method(None, per).split("; ")[-1] == CI_METHODS["auto"]


def test_each_target_gets_its_own_residual_variance():
    """Two targets, one updated exactly and one with noise 0.3, sharing features: each
    target's intervals are those of its own least squares (textbook s^2 = RSS / (n - p)),
    the exact one's at the rounding level."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(50, 3))
    Y = np.stack([X @ [1.0, 0.5, 0.0], X @ [-2.0, 0.0, 1.0] + 0.3 * rng.normal(size=50)], 1)
    structure = np.zeros((2, 3, 6))                  # theta = [row of target 0, row of 1]
    for j in range(2):
        structure[j, :, 3 * j:3 * j + 3] = np.eye(3)
    blocks = pers.noise_blocks(structure)
    assert blocks.param_block.tolist() == [0, 0, 0, 1, 1, 1]
    H = np.kron(np.eye(2), X.T @ X)
    b = (X.T @ Y).T.reshape(-1)
    theta, se, s2, dof = pers.least_squares_intervals(H, b, (Y ** 2).sum(0), 50.0, blocks)
    ref = np.linalg.lstsq(X, Y[:, 1], rcond=None)[0]
    r = Y[:, 1] - X @ ref
    inv = np.diag(np.linalg.inv(X.T @ X))
    np.testing.assert_allclose(theta[3:], ref, rtol=1e-10)
    np.testing.assert_allclose(s2[1], r @ r / 47, rtol=1e-8)
    np.testing.assert_allclose(se[3:], np.sqrt(r @ r / 47 * inv), rtol=1e-8)
    assert dof.tolist() == [47, 47]
    assert (se[:3] < 1e-8).all() and (se[:3] > 0).all()           # resolution of RSS
    # the pooled variance of the two targets (the earlier rule) is wrong for both
    _, pooled_se, _, _ = pers.least_squares_intervals(H, b, (Y ** 2).sum(), 50.0, 2)
    assert (pooled_se[3:] < 0.75 * se[3:]).all() and (pooled_se[:3] > 0.01).all()


def test_a_parameter_in_several_targets_joins_them_in_one_group():
    structure = np.zeros((3, 2, 3))
    structure[0, 0, 0] = structure[1, 0, 0] = 1.0    # parameter 0 enters targets 0 and 1
    structure[1, 1, 1] = structure[2, 1, 2] = 1.0
    blocks = pers.noise_blocks(structure)
    assert blocks.param_block.tolist() == [0, 0, 1]
    assert blocks.n_targets.tolist() == [2, 1] and blocks.targets.tolist() == [0, 0, 1]


def test_a_sparse_fit_has_intervals_of_its_refit_and_none_for_pruned_terms():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(60, 4))
    y = X @ [1.0, 0.0, -0.5, 0.0] + 0.2 * rng.normal(size=60)
    keep = np.array([True, False, True, False])
    theta, se, s2, dof = pers.least_squares_intervals(X.T @ X, X.T @ y, np.array([y @ y]),
                                                      60.0, pers.noise_blocks(np.eye(4)[None]),
                                                      support=keep)
    Xk = X[:, keep]
    ref = np.linalg.lstsq(Xk, y, rcond=None)[0]
    r = y - Xk @ ref
    np.testing.assert_allclose(theta[keep], ref, rtol=1e-10)
    assert (theta[~keep] == 0).all() and np.isnan(se[~keep]).all() and dof.tolist() == [58]
    np.testing.assert_allclose(se[keep], np.sqrt(r @ r / 58 * np.diag(np.linalg.inv(Xk.T @ Xk))),
                               rtol=1e-8)


def _run(file, *extra, truth=None):
    over = ["system=generic", "data=files", f"data.path={file}", "data.states=[x1,x2]",
            "data.inputs=[u]", "feature_map=polynomial", "feature_map.degree=3",
            "output.plot=false", "progress=false", "R=1"]
    return fnsysid.run(over + ([f"data.truth={truth}"] if truth else []) + list(extra))


@pytest.mark.slow
def test_sparse_estimates_csv_has_intervals_on_the_kept_terms_only(tmp_path):
    file, X, Y = duffing_fleet(tmp_path, M=4, N=4)
    res = _run(file, "strategy=centralized_exact", "sparsity=stlsq")
    est = res.estimates.set_index("parameter")
    kept = est["estimate"] != 0
    assert set(est.index[kept]) == TRUE
    assert est.loc[~kept, ["se", "ci_lo", "ci_hi"]].isna().all().all()
    # x2+'s kept terms: the se of its own least squares on those four features
    cols = [Polynomial(degree=3).feature_names(2, 1).index(f) for f in ("x0", "x1", "u0", "x0^3")]
    Xk = X[:, cols]
    ref = np.linalg.lstsq(Xk, Y[:, 1], rcond=None)[0]
    r = Y[:, 1] - Xk @ ref
    want = np.sqrt(r @ r / (len(r) - 4) * np.diag(np.linalg.inv(Xk.T @ Xk)))
    got = est.loc[["x2+:x1", "x2+:x2", "x2+:u", "x2+:x1^3"], "se"].to_numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # x1+ = x1 + dt x2 holds exactly: its intervals are at the rounding level
    assert (est.loc[["x1+:x1", "x1+:x2"], "se"] < 1e-8).all()
    assert "kept terms" in res.summary["ci"]["estimates"]
    # the four clients' alpha, beta differ by up to 20 %: their own fits on the kept terms
    # differ beyond their noise, which the intervals do not describe (the test used to be
    # skipped under sparsity)
    differ = res.summary["ci"]["clients_differ"]
    assert differ["support"] == "the kept terms" and differ["rejected"] == [True]
    assert differ["pvalue"][0] < 1e-10
    assert res.summary["ci"]["method"].startswith("estimates: Student's t on the pooled")
    assert "Welch" not in res.summary["ci"]["method"]


def homogeneous_fleet(path, S=200, M=5, N=4, L=40, noise=0.01, seed=7):
    """S repeats of M identical Duffing oscillators (x1+ = x1 + dt x2 exactly, noise
    ``noise`` on x2+ only), N trajectories of L samples each, with their truth file (the six
    terms of the model; the other 34 are 0)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(S, M, N, 2))
    u = rng.normal(size=(S, M, N, L))
    xs = [x]
    for t in range(L - 1):
        x1, x2 = x[..., 0], x[..., 1]
        x = np.stack([x1 + DT * x2, x2 + DT * (-K * x1 - C * x2 - BETA * x1 ** 3 + u[..., t])
                      + noise * rng.normal(size=x1.shape)], -1)
        xs.append(x)
    xs = np.stack(xs, 3)                                     # (S, M, N, L, 2)
    s, m, j, t = np.meshgrid(*map(np.arange, (S, M, N, L)), indexing="ij")
    df = pd.DataFrame({"repeat": s.ravel(), "client": [f"c{i}" for i in m.ravel()],
                       "trajectory": j.ravel(), "t": t.ravel(), "x1": xs[..., 0].ravel(),
                       "x2": xs[..., 1].ravel(), "u": u.ravel()})
    file = path / "fleet.parquet"
    df.to_parquet(file)
    truth = {"x1+:x1": 1, "x1+:x2": DT, "x2+:x1": -DT * K, "x2+:x2": 1 - DT * C, "x2+:u": DT,
             "x2+:x1^3": -DT * BETA}
    pd.DataFrame([dict(repeat=a, client=f"c{i}", parameter=p, value=v) for a in range(S)
                  for i in range(M) for p, v in truth.items()]).to_csv(path / "truth.csv",
                                                                      index=False)
    return file, path / "truth.csv"


def _inside(lo, hi, truth):
    truth = np.nan_to_num(truth)                             # terms outside the model: 0
    return (lo <= truth) & (truth <= hi)


@pytest.fixture(scope="module")
def homogeneous_auto(tmp_path_factory):
    """The run of the homogeneous fleet (below) with pooled least squares and auto."""
    file, truth = homogeneous_fleet(tmp_path_factory.mktemp("homogeneous"))
    return _run(file, "strategy=centralized_exact", "personalize=auto", truth=truth)


@pytest.mark.slow
def test_generic_intervals_cover_each_target_95_percent(homogeneous_auto):
    """200 repeats of 5 identical Duffing oscillators, noise 0.01 on x2+ only: the 95 %
    intervals of pooled least squares (estimates.csv) cover x2+'s 20 coefficients in 93-97 %
    of the 4000 (repeat, term) pairs (binomial sd 0.3 %), the clients' own least squares
    (client_estimates.csv, local) in 93-97 % of 20000; x1+'s intervals are at the rounding
    level and cover its exact coefficients. With one pooled variance x2+'s were 81-84 %.
    auto's intervals are per target too and cover at least 93 % (they over-cover on a
    homogeneous fleet: the next test)."""
    res = homogeneous_auto
    est = res.estimates
    x2 = est["parameter"].str.startswith("x2+")
    inside = _inside(est["ci_lo"], est["ci_hi"], est["true_mean"])
    assert len(inside[x2]) == 4000 and 0.93 <= inside[x2].mean() <= 0.97
    assert (est.loc[~x2, "se"] < 1e-8).all() and inside[~x2].all()
    ce = res.client_estimates
    x2 = ce["parameter"].str.startswith("x2+")
    z = pers.z_value(0.95)
    inside = _inside(ce["local"] - z * ce["local_se"], ce["local"] + z * ce["local_se"],
                     ce["truth"])
    assert len(inside[x2]) == 20000 and 0.93 <= inside[x2].mean() <= 0.97
    assert (ce.loc[~x2, "local_se"] < 1e-6).all() and inside[~x2].all()
    # auto's intervals are per target too
    inside = _inside(ce["ci_lo"], ce["ci_hi"], ce["truth"])
    assert inside[x2].mean() >= 0.93 and inside[~x2].mean() >= 0.93


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="auto's intervals over-cover where the clients are "
                   "alike (the unrestricted REML Sigma_ci; docs/ALGORITHMS.md, intervals)")
def test_auto_intervals_on_a_homogeneous_fleet_cover_at_most_97_percent(homogeneous_auto):
    """The goal: auto's 95 % intervals of x2+ cover at most 97 % of the 20000 (repeat,
    client, term) triples of the homogeneous fleet (measured 0.99875)."""
    ce = homogeneous_auto.client_estimates
    x2 = ce["parameter"].str.startswith("x2+")
    inside = _inside(ce["ci_lo"], ce["ci_hi"], ce["truth"])
    assert inside[x2].mean() <= 0.97


@pytest.mark.slow
def test_sparse_intervals_cover_the_kept_terms_95_percent(tmp_path):
    """The same fleet with sparsity=stlsq: the six true terms are kept in every repeat, their
    intervals (refit on the support) cover x2+'s four in 93-97 % of 800 pairs (binomial sd
    0.8 %); the 34 pruned terms have none."""
    file, truth = homogeneous_fleet(tmp_path)
    res = _run(file, "strategy=centralized_exact", "sparsity=stlsq", truth=truth)
    est = res.estimates
    kept = est["estimate"] != 0
    assert set(est.loc[kept, "parameter"]) == TRUE and kept.sum() == 6 * 200
    assert est.loc[~kept, "se"].isna().all()
    x2 = kept & est["parameter"].str.startswith("x2+")
    inside = _inside(est["ci_lo"], est["ci_hi"], est["true_mean"])[x2]
    assert len(inside) == 800 and 0.93 <= inside.mean() <= 0.97
    # identical clients: Cochran's Q on the kept terms flags no repeat
    differ = res.summary["ci"]["clients_differ"]
    assert len(differ["pvalue"]) == 200 and not any(differ["rejected"])


def _generic_data(noise_x1: float):
    """One repeat of three clients of a generic two-state model with its own features
    (x1, x2, u), x1+ with noise ``noise_x1`` and x2+ with noise 0.1."""
    model = build(compose_cfg("system=generic", "data=files", "data.path=x",
                              "data.states=[x1,x2]", "data.inputs=[u]"))[0]
    rng = np.random.default_rng(5)
    Phi = rng.normal(size=(300, 3))
    Y = Phi @ rng.normal(size=(3, 2)) + [noise_x1, 0.1] * rng.normal(size=(300, 2))
    stats = ragged_stats(model, Phi, Y, np.full(3, 100))
    H, b, yy, n, phi2max, phi_mean, y_mean, yy_t, factor, phimax = (a[None] for a in stats)
    return model, ClientData(np.full((1, 3, model.p), np.nan), H, b, yy, n, None, None, None,
                             phi2max, phi_mean, y_mean, yy_t, factor, phimax)


def test_auto_has_one_residual_variance_per_target():
    """x1+ exact, x2+ with noise 0.1 (three alike clients): auto's intervals are per target,
    those of x1+ at the floor pers.EXACT of its mean square, those of x2+ near the fleet's
    variance of x2+ (pooled over the clients)."""
    model, data = _generic_data(0.0)
    yy, blocks = target_stats(model, data)
    theta, se, fl = pers.auto(data.H, data.b, yy, data.n, blocks)
    _, local_se, s2, dof = own_intervals(model, data)
    x1 = blocks.param_block == 0
    assert fl.s2[0, 1] == pytest.approx((s2 * dof)[0, :, 1].sum() / dof[0, :, 1].sum())
    ms = yy[0, :, 0].sum() / data.n[0].sum()
    assert fl.s2[0, 0] == pytest.approx(pers.EXACT * ms, rel=1e-6)
    assert (se[..., x1] < 1e-3 * se[..., ~x1].min()).all()
    if not fl.Sigma.any():                              # alike: pooled least squares
        ref = (fl.s2[0, 1] * np.diagonal(np.linalg.inv(data.H[0].sum(0)))
               + np.diagonal(fl.Sigma_ci[0]))[~x1]
        np.testing.assert_allclose(se[0, :, ~x1].T ** 2, np.broadcast_to(ref, (3, 3)),
                                   rtol=1e-8)


def test_the_frontier_summary_counts_the_rules_that_meet_the_goal_on_every_seed():
    # scripts/interval_coverage.py --frontier: a rule meets 93-97 % only when every eps and
    # seed does; among those within 97 % at the first eps, the best lowest coverage at the
    # second is named first
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "interval_coverage.py"
    spec = importlib.util.spec_from_file_location("interval_coverage", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cov = {"frontier 1,0": {(0.0, 0): 0.95, (0.0, 1): 0.96, (0.3, 0): 0.94, (0.3, 1): 0.93},
           "frontier 2,0": {(0.0, 0): 0.95, (0.0, 1): 0.975, (0.3, 0): 0.96, (0.3, 1): 0.96},
           "frontier 3,0": {(0.0, 0): 0.90, (0.0, 1): 0.91, (0.3, 0): 0.80, (0.3, 1): 0.81}}
    rows = pd.DataFrame([{"eps": e, "seed": s, "Sigma'": k, "coverage": v}
                         for k, d in cov.items() for (e, s), v in d.items()])
    text = mod.frontier_summary(rows, [0.0, 0.3])
    lines = text.splitlines()
    assert lines[0].startswith("frontier: 1 of 3 rules")
    # "2,0" exceeds 97 % at eps = 0 on seed 1: the best within it is "1,0", then "3,0"
    assert "lam,d = 1,0: eps=0: 0.950-0.960, eps=0.3: 0.930-0.940" in lines[1]
    assert "lam,d = 3,0" in lines[2] and len(lines) == 3
