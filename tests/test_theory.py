"""Theorem 1 quantities computed from data against direct numpy computations."""

import numpy as np
import pytest

from fnsysid.dynamics.model import generate
from fnsysid.results.theory import heterogeneity, theorem1
from tests.conftest import make


def test_theorem1_ingredients_match_direct_computation():
    _, model, *_ = make("system=synthetic", "system.disturbance.scale=0.3")
    d = generate(model, M=6, N=40, T=5, eps=0.2, repeats=2, seed=0, keep_samples=True)
    th = theorem1(d, model, delta=0.05)
    # sigma_w: the disturbance's standard deviation, recovered from pooled residuals
    np.testing.assert_allclose(th["sigma_w"], 0.3, rtol=0.1)
    Phi = d.Phi[0].reshape(-1, 5)[d.mask[0].reshape(-1) > 0]
    assert th["N_tot"][0] == len(Phi) == 6 * 40 * 5
    np.testing.assert_allclose(th["s_phi2"][0], 2 * np.linalg.eigvalsh(Phi.T @ Phi)[0] / len(Phi))
    np.testing.assert_allclose(th["b_phi"][0], (Phi ** 2).sum(axis=1).max())
    row = th.iloc[0]
    expect = (8 * row.sigma_w / row.s_phi2 * np.sqrt((3 + 5 + np.log(2 * 6 / 0.05)) / 1200)
              + (row.b_phi / row.s_phi2 + 0.5) * row.eps)
    np.testing.assert_allclose(row.bound, expect)
    np.testing.assert_allclose(row.bound_rel, row.bound / np.linalg.norm(d.theta_true[0],
                                                                          axis=-1).min())


def test_heterogeneity_is_the_largest_pairwise_distance():
    theta = np.array([[[0.0, 0.0], [3.0, 4.0], [1.0, 1.0]]])
    np.testing.assert_allclose(heterogeneity(theta), [5.0])
    big = np.zeros((1, 2500, 2))
    big[0, 0], big[0, 1] = [1.0, 0.0], [-1.0, 0.0]
    assert heterogeneity(big)[0] >= 2.0                    # upper bound for large M


@pytest.mark.slow
@pytest.mark.parametrize("strategy, extra", [
    ("oneshot", ["R=1"]),
    ("fedavg", ["optimizer.reduction=mean", "optimizer.scale_features=diagonal", "lr=0.2",
                "R=200"]),
])
def test_error_falls_as_one_over_sqrt_m_without_heterogeneity(strategy, extra, tmp_path):
    """Theorem 1 at eps = 0 with independent noise per client: slope -1/2 in M (log-log)."""
    from fnsysid.app.experiment import run_experiment
    from fnsysid.results.plotting.paper_panels import slope
    from tests.conftest import compose_cfg

    Ms, finals = [1, 4, 16, 64, 256], []
    for M in Ms:
        cfg = compose_cfg("system=synthetic", f"strategy={strategy}", "eps=0.0", f"M={M}",
                          "repeats=20", "output.plot=false", *extra)
        finals.append(run_experiment(cfg, tmp_path / f"M{M}")["final_e_max_mean"])
    b = slope(Ms, finals)
    assert -0.6 <= b <= -0.4, (b, finals)


def test_heterogeneity_matches_brute_force():
    theta = np.random.default_rng(0).normal(size=(3, 50, 4))
    d = np.linalg.norm(theta[:, :, None] - theta[:, None], axis=-1).max(axis=(1, 2))
    np.testing.assert_allclose(heterogeneity(theta), d, rtol=1e-10)
