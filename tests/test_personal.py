"""Personalized client models (personalize=finetune/auto) and confidence intervals."""

from __future__ import annotations

import numpy as np
import pytest

from fnsysid.app.experiment import execute
from fnsysid.config.errors import ConfigError
from fnsysid.dynamics.model import generate, least_squares, pooled
from fnsysid.learning import personalize as pers
from tests.conftest import cli_in_process, compose_cfg, make


def _stats(X, y):
    """Sufficient statistics of a scalar-output regression (n_y = 1)."""
    return X.T @ X, X.T @ y, float(y @ y), float(len(y))


def test_least_squares_intervals_are_the_textbook_ones():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, 3))
    y = X @ np.array([1.0, -2.0, 0.5]) + 0.3 * rng.normal(size=40)
    theta, se, s2, dof = pers.least_squares_intervals(*_stats(X, y), 1)
    ref = np.linalg.lstsq(X, y, rcond=None)[0]
    r = y - X @ ref
    ref_s2 = r @ r / (40 - 3)
    np.testing.assert_allclose(theta, ref, rtol=1e-10)
    np.testing.assert_allclose(s2, ref_s2, rtol=1e-8)
    np.testing.assert_allclose(se, np.sqrt(ref_s2 * np.diag(np.linalg.inv(X.T @ X))), rtol=1e-8)
    assert dof == 37
    assert pers.z_value(0.95) == pytest.approx(1.959964, abs=1e-6)


def test_singular_gram_has_no_standard_errors():
    X = np.zeros((10, 2))
    X[:, 0] = np.arange(10.0)                   # the second feature never moves
    H, b, yy, n = _stats(X, np.arange(10.0))
    _, se, _, _ = pers.least_squares_intervals(H, b, yy, n, 1)
    assert np.isnan(se).all()


def _fleet(eps, repeats=4, M=20, seed=0):
    settings, model, _, _ = make("system=synthetic")
    return model, generate(model, M, 10, 5, eps, repeats, seed)


@pytest.mark.slow
def test_auto_without_heterogeneity_is_the_pooled_solution():
    """At eps = 0 the homogeneity test does not reject in most repeats: there Sigma = 0 and
    every client gets the fleet's generalized least squares, which with the fleet's residual
    variance per target is pooled least squares."""
    model, d = _fleet(0.0, repeats=6)
    blocks = pers.noise_blocks(model.structure)
    msg = pers.client_message(d.H, d.b, d.yy_target, d.n, blocks)
    fl = pers.fleet(msg, blocks)
    calm = fl.pvalue >= pers.HOMOGENEITY_LEVEL
    assert calm.sum() >= 4 and not fl.Sigma[calm].any()
    theta, se = pers.client_posterior(msg, fl, blocks)
    np.testing.assert_allclose(theta[calm], np.broadcast_to(fl.mu[calm, None],
                                                            theta[calm].shape))
    np.testing.assert_allclose(fl.mu[calm], least_squares(d.H.sum(1), d.b.sum(1))[calm],
                               rtol=1e-8)
    # its standard errors: the fleet's variance of each target times (sum H)^-1, plus the
    # spread the intervals assume (the unrestricted REML Sigma_ci)
    s2 = msg.rss.sum(1) / msg.dof.sum(1)                              # (S, 3)
    ref = s2[:, blocks.param_block] * np.diagonal(np.linalg.inv(d.H.sum(1)), axis1=1, axis2=2)
    ref = ref + np.diagonal(fl.Sigma_ci, axis1=1, axis2=2)
    np.testing.assert_allclose(se[calm, 0] ** 2, ref[calm], rtol=1e-8)


@pytest.mark.slow
def test_auto_gives_the_same_models_whatever_the_regressors_units():
    """Regressors in other units (features times 1e-4..1e4: H -> D H D, b -> D b) and a
    target in other units make the parameters theta / D (times the target's unit); auto
    works on unit-scaled parameters of unit information, so its models, standard errors,
    test and rank are those of the original units mapped back (before, the raw
    parameters' scales entered its eigenvalue cuts and the models broke: an error of 0.99
    where the shared model's was 1e-4)."""
    model, d = _fleet(1.0, repeats=3)
    blocks = pers.noise_blocks(model.structure)
    sse = None
    theta, se, fl = pers.auto(d.H, d.b, d.yy_target, d.n, blocks, sse=sse)
    D = 10.0 ** np.random.default_rng(1).uniform(-4, 4, size=d.b.shape[-1])
    # and the first target in units 1e-8 smaller: its moments and sums of squares with it,
    # its parameters 1e-8 smaller (groups whose noise variances differ by 1e16, as a target
    # updated exactly beside a noisy one in other units)
    k = np.where(blocks.param_block == blocks.param_block[0], 1e-8, 1.0)
    ky = np.where(np.arange(d.yy_target.shape[-1]) == 0, 1e-8, 1.0)
    H2, b2 = d.H * np.outer(D, D), d.b * D * k
    theta2, se2, fl2 = pers.auto(H2, b2, d.yy_target * ky ** 2, d.n, blocks, sse=sse)
    D = D / k
    np.testing.assert_allclose(fl2.pvalue, fl.pvalue, rtol=1e-9)
    np.testing.assert_allclose(theta2 * D, theta, rtol=0, atol=1e-6 * se.max())
    assert np.abs(theta2 * D - theta).max() <= 1e-3 * se.min()
    np.testing.assert_allclose(se2 * D, se, rtol=1e-4)
    ranks = [np.linalg.matrix_rank(S / np.outer(c, c), hermitian=True)
             for S, c in zip(fl.Sigma, fl.scale, strict=True)]
    ranks2 = [np.linalg.matrix_rank(S / np.outer(c, c), hermitian=True)
              for S, c in zip(fl2.Sigma, fl2.scale, strict=True)]
    assert ranks == ranks2 and max(ranks) > 0


def test_homogeneity_from_the_messages_equals_the_fleets_test():
    model, d = _fleet(0.3, repeats=3)
    blocks = pers.noise_blocks(model.structure)
    msg = pers.client_message(d.H, d.b, d.yy_target, d.n, blocks)
    _, _, J, _, theta = pers.own_estimates(msg, blocks)
    Q, pv = pers.homogeneity(theta, J, msg.own, pers.variance_dof(msg))
    from fnsysid.learning.ownfit import own_fits

    Q2, pv2 = pers.homogeneity_from(msg, blocks, own_fits(d.H, d.b).theta)
    np.testing.assert_allclose(Q2, Q, rtol=1e-9)
    np.testing.assert_allclose(pv2, pv, rtol=1e-6, atol=1e-300)


@pytest.mark.slow
def test_pooled_intervals_say_when_the_clients_differ(caplog):
    """The intervals of estimates.csv treat the clients as one system: where Cochran's Q
    rejects that (family-wise over the repeats) the run says so and the summary records
    it; a homogeneous fleet is not flagged."""
    from fnsysid.app.api import run

    caplog.set_level("WARNING", logger="fnsysid")
    base = ["system=synthetic", "strategy=centralized_exact", "R=2", "progress=false"]
    same = run([*base, "eps=0"])
    d = same.summary["ci"]["clients_differ"]
    assert d["test"] == "Cochran's Q" and not any(d["rejected"])
    assert len(d["pvalue"]) == 5 and min(d["pvalue"]) > 0.01
    assert not [r for r in caplog.records if "treat the clients" in r.getMessage()]
    apart = run([*base, "eps=1"])
    assert all(apart.summary["ci"]["clients_differ"]["rejected"])
    said = [r.getMessage() for r in caplog.records if "treat the clients" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(
        "the intervals of estimates.csv (pooled least squares) treat the clients as one "
        "system, but their own fits differ by more than their noise (Cochran's Q, p = ")
    assert "in 5 of 5 repeats" in said[0]
    assert "cover the pooled value, the clients' truths weighted by their data" in said[0]
    # an average of the clients' own fits covers the same average of their truths
    caplog.clear()
    run([*base, "eps=1", "strategy=oneshot"])
    said = [r.getMessage() for r in caplog.records if "treat the clients" in r.getMessage()]
    assert len(said) == 1 and "the intervals cover the same average of the clients' " \
        "truths, not any one client's" in said[0]
    # an iterate has no intervals: nothing to test
    assert "clients_differ" not in run([*base, "eps=1", "strategy=fedavg"]).summary["ci"]


@pytest.mark.slow
def test_homogeneity_is_cochrans_q_over_the_clients():
    """Q = sum_i (theta_i - mu_F)' J_i (theta_i - mu_F), mu_F the fixed-effect mean, against
    chi-square with (m - 1) p degrees of freedom; computed here client by client."""
    from scipy.stats import chi2

    rng = np.random.default_rng(1)
    M, p = 6, 3
    A = rng.normal(size=(1, M, p, p))
    J = A @ np.swapaxes(A, -1, -2) + np.eye(p)
    theta = rng.normal(size=(1, M, p))
    own = np.ones((1, M), bool)
    own[0, 2] = False                                      # a client without its own fit
    Q, pv = pers.homogeneity(theta, J, own)
    keep = [i for i in range(M) if i != 2]
    mu = np.linalg.solve(sum(J[0, i] for i in keep), sum(J[0, i] @ theta[0, i] for i in keep))
    ref = sum((theta[0, i] - mu) @ J[0, i] @ (theta[0, i] - mu) for i in keep)
    assert Q[0] == pytest.approx(ref, rel=1e-10)
    assert pv[0] == pytest.approx(chi2.sf(ref, (len(keep) - 1) * p), rel=1e-10)
    # the information's variances estimated on 7 degrees of freedom: Q / k against F(k, 7)
    from scipy.stats import f

    k = (len(keep) - 1) * p
    assert pers.homogeneity(theta, J, own, np.array([7.0]))[1][0] == pytest.approx(
        f.sf(ref / k, k, 7), rel=1e-10)


def test_cochrans_q_keeps_its_level_with_variances_on_few_degrees_of_freedom():
    """Homogeneous fleets of three clients, each with one residual degree of freedom (three
    samples, two coefficients): Q scaled by the fleet's residual variance, estimated on 3
    degrees of freedom, rejected 26 % of them at level 0.05 against the chi-square (the
    variance taken as known); against F it rejects 5 % (one group of targets: exact)."""
    rng = np.random.default_rng(0)
    S, M, n = 4000, 3, 3
    X = rng.normal(size=(S, M, n, 2))
    y = X @ np.array([1.0, -0.5]) + 0.3 * rng.normal(size=(S, M, n))
    H = np.einsum("smti,smtj->smij", X, X)
    b = np.einsum("smti,smt->smi", X, y)
    msg = pers.client_message(H, b, (y ** 2).sum(axis=-1), np.full((S, M), n), 1)
    from fnsysid.learning.ownfit import own_fits

    assert (pers.variance_dof(msg) == 3).all()
    _, pv = pers.homogeneity_from(msg, 1, own_fits(H, b).theta)
    assert 0.04 < (pv < 0.05).mean() < 0.06 and 0.005 < (pv < 0.01).mean() < 0.015
    _, _, J, _, theta = pers.own_estimates(msg, 1)
    assert (pers.homogeneity(theta, J, msg.own)[1] < 0.05).mean() > 0.2   # chi-square


def test_reml_of_one_parameter_with_equal_variances_is_the_closed_form():
    """p = 1, every client with variance v: the REML estimate of the heterogeneity variance
    is max(0, sample variance - v) (the sample variance with m - 1), what the EM iteration
    must converge to."""
    rng = np.random.default_rng(2)
    M, v = 30, 0.5
    theta = (3.0 * rng.normal(size=(2, M)) + np.sqrt(v) * rng.normal(size=(2, M)))[..., None]
    J = np.full((2, M, 1, 1), 1 / v)
    Sig, full = pers.reml(theta, J, np.ones((2, M), bool), iterations=5000, tol=1e-13)
    ref = theta[..., 0].var(axis=1, ddof=1) - v
    np.testing.assert_allclose(Sig[:, 0, 0], ref, rtol=1e-6)
    np.testing.assert_allclose(full[:, 0, 0], ref, rtol=1e-4)
    # no spread beyond the noise: Sigma = 0
    flat = np.sqrt(v) * rng.normal(size=(1, M, 1)) * 0.3
    assert pers.reml(flat, J[:1], np.ones((1, M), bool))[0][0, 0, 0] == 0.0


def test_heterogeneity_is_found_along_the_true_directions():
    """synthetic: theta_i = theta_0 + g1 V + g2 U, two directions; at eps = 3 the test
    rejects and the top two directions of Sigma lie in the span of the true deviations."""
    model, d = _fleet(3.0)
    _, _, fl = pers.auto(d.H, d.b, d.yy_target, d.n, pers.noise_blocks(model.structure))
    assert (fl.pvalue < 1e-6).all()
    dev = d.theta_true - d.theta_true.mean(axis=1, keepdims=True)     # (S, M, p)
    for s in range(d.n.shape[0]):
        basis = np.linalg.svd(dev[s], full_matrices=False)[2][:2]      # true 2-d span
        vals, vecs = np.linalg.eigh(fl.Sigma[s])
        top = vecs[:, -2:]
        inside = np.linalg.norm(basis @ top, axis=0)    # cosines of the top directions
        assert (inside > 0.9).all()


@pytest.mark.slow
def test_auto_beats_local_and_pooled_at_large_heterogeneity_and_matches_pooled_at_none():
    errs = {}
    for eps in (0.0, 3.0):
        model, d = _fleet(eps, repeats=6)
        norm = np.linalg.norm(d.theta_true, axis=-1)
        err = {
            "local": least_squares(d.H, d.b),
            "pooled": least_squares(d.H.sum(1), d.b.sum(1))[:, None],
            "auto": pers.auto(d.H, d.b, d.yy_target, d.n,
                              pers.noise_blocks(model.structure))[0],
        }
        errs[eps] = {k: float((np.linalg.norm(v - d.theta_true, axis=-1) / norm).mean())
                     for k, v in err.items()}
    assert errs[0.0]["auto"] < 0.6 * errs[0.0]["local"]
    assert errs[0.0]["auto"] < 1.10 * errs[0.0]["pooled"]
    assert errs[3.0]["auto"] < 0.65 * min(errs[3.0]["local"], errs[3.0]["pooled"])


def test_a_client_without_data_gets_the_fleet_model_and_finite_errors():
    _, d = _fleet(1.0, repeats=2)
    H, b, yy, n = d.H.copy(), d.b.copy(), d.yy.copy(), d.n.copy()
    H[:, 3], b[:, 3], yy[:, 3] = 0.0, 0.0, 0.0          # client 3: all-zero data
    e0 = np.eye(15)[0]
    H[:, 5], b[:, 5] = 4.0 * np.outer(e0, e0), 4.0 * e0  # client 5: data in one direction only
    theta, se, fl = pers.auto(H, b, yy, n, 3)
    assert np.isfinite(theta).all() and np.isfinite(se).all()
    np.testing.assert_allclose(theta[:, 3], fl.mu, atol=1e-10)
    # its uncertainty is the fleet's spread plus that of the mean
    np.testing.assert_allclose(se[:, 3] ** 2, np.diagonal(fl.Sigma_ci + fl.cov_mu, axis1=1,
                                                          axis2=2), rtol=1e-8, atol=1e-14)


def test_one_client_alone_computes_what_the_fleet_computes_for_it():
    """What a federated node does: its own message and the server's reply give the same
    model as the vectorized computation over all clients."""
    model, d = _fleet(1.0, repeats=2)
    blocks = pers.noise_blocks(model.structure)
    msg = pers.client_message(d.H, d.b, d.yy_target, d.n, blocks)
    fl = pers.fleet(msg, blocks)
    theta, se = pers.client_posterior(msg, fl, blocks)
    m = 7
    one = pers.client_message(d.H[:, m:m + 1], d.b[:, m:m + 1], d.yy_target[:, m:m + 1],
                              d.n[:, m:m + 1], blocks)
    t1, s1 = pers.client_posterior(one, fl, blocks)
    np.testing.assert_allclose(t1[:, 0], theta[:, m], rtol=1e-12)
    np.testing.assert_allclose(s1[:, 0], se[:, m], rtol=1e-12)


@pytest.mark.slow
def test_run_with_auto_writes_client_estimates_errors_and_summary():
    r = execute(compose_cfg("system=synthetic", "personalize=auto", "R=3", "repeats=2", "M=5",
                            "output.plot=false", "strategy=centralized_exact"),
                choices={}, given=frozenset())
    ce = r.client_estimates
    assert len(ce) == 2 * 5 * 15
    assert list(ce.columns) == ["repeat", "client", "parameter", "estimate", "se", "ci_lo",
                                "ci_hi", "local", "local_se", "local_lo", "local_hi", "truth"]
    np.testing.assert_allclose(ce["ci_hi"] - ce["estimate"], 1.959964 * ce["se"], rtol=1e-5)
    np.testing.assert_allclose(ce["estimate"], r.client_models.ravel())
    # local intervals: Student's t on n - 5 degrees of freedom (five parameters per target)
    from scipy.stats import t

    n = np.repeat(r.dataset.train.n.ravel(), 15)
    q = t.ppf(0.975, n - 5)
    np.testing.assert_allclose(ce["local_hi"] - ce["local"], q * ce["local_se"], rtol=1e-10)
    np.testing.assert_allclose(ce["local"] - ce["local_lo"], q * ce["local_se"], rtol=1e-10)
    e = r.errors
    last = e[e["round"] == 3]
    assert e.loc[e["round"] < 3, "e_pers_mean"].isna().all()
    truth = ce["truth"].to_numpy().reshape(2, 5, 15)
    err = np.linalg.norm(r.client_models - truth, axis=-1) / np.linalg.norm(truth, axis=-1)
    np.testing.assert_allclose(last["e_pers_mean"], err.mean(axis=1))
    np.testing.assert_allclose(last["e_pers_max"], err.max(axis=1))
    assert r.summary["final_e_pers_mean_mean"] == pytest.approx(err.mean(axis=1).mean())
    assert r.summary["personalize"] == "auto"
    assert r.summary["ci"]["estimates"] == "pooled least squares"
    # its REML converged in both repeats, within the cap, and nothing is flagged
    reml = r.summary["personalize_reml"]
    assert reml["converged"] == [True, True] and all(0 < n <= 201 for n in reml["iterations"])
    # the homogeneity test of each repeat as the fleet computed it, and the rank it led to
    from fnsysid.results.personal import own_sse, target_stats

    d = r.dataset.train
    yy, blocks = target_stats(r.model, d)
    fl = pers.fleet(pers.client_message(d.H, d.b, yy, d.n, blocks, own_sse(r.model, d)), blocks)
    np.testing.assert_allclose(reml["Q"], fl.Q, rtol=1e-9)
    np.testing.assert_allclose(reml["pvalue"], fl.pvalue, rtol=1e-6)
    assert reml["rejected"] == [bool(v < 0.05) for v in fl.pvalue] and reml["level"] == 0.05
    assert reml["rank"] == [int(np.linalg.matrix_rank(S)) if np.any(S) else 0 for S in fl.Sigma]
    assert all(k == 0 for k, rej in zip(reml["rank"], reml["rejected"], strict=True) if not rej)
    assert "client_estimates" not in r.summary["ci"]
    # pooled least squares intervals from the pooled statistics
    data = r.dataset.train
    p = pooled(data)
    _, se, _, _ = pers.least_squares_intervals(p.H, p.b, p.yy_target, p.n,
                                               pers.noise_blocks(r.model.structure))
    np.testing.assert_allclose(r.estimates["se"], se.ravel())
    assert (r.estimates["ci_lo"] < r.estimates["estimate"]).all()


def test_fedavg_estimates_have_no_intervals_and_say_why():
    r = execute(compose_cfg("system=synthetic", "R=2", "repeats=1", "M=3", "output.plot=false"),
                choices={}, given=frozenset())
    assert r.estimates["se"].isna().all() and r.estimates["ci_lo"].isna().all()
    assert "iterate of gradient steps" in r.summary["ci"]["estimates"]
    assert r.client_estimates is None and "e_pers_max" not in r.errors
    assert r.summary["final_e_pers_mean_mean"] is None


def test_oneshot_intervals_average_the_clients_covariances():
    r = execute(compose_cfg("system=synthetic", "strategy=oneshot", "R=1", "repeats=1", "M=4",
                            "output.plot=false"), choices={}, given=frozenset())
    d = r.dataset.train
    _, se, _, _ = pers.least_squares_intervals(d.H, d.b, d.yy_target, d.n,
                                               pers.noise_blocks(r.model.structure))
    np.testing.assert_allclose(r.estimates["se"], np.sqrt((se[0] ** 2).sum(0)) / 4)


@pytest.mark.slow
def test_pooled_estimates_intervals_use_students_t_on_the_pooled_degrees_of_freedom():
    """strategy=centralized_exact: ci = estimate -/+ t se with t the 0.975 quantile of
    Student's t on the pooled residual variance's n - p_k degrees of freedom: M = 3 clients,
    N = 2 trajectories of T = 4 samples give 24 samples per target, and the synthetic model
    fits 5 parameters per target (its own variance), so 19 degrees of freedom."""
    from scipy.stats import t

    r = execute(compose_cfg("system=synthetic", "strategy=centralized_exact", "R=1",
                            "repeats=1", "M=3", "N=2", "T=4", "output.plot=false"),
                choices={}, given=frozenset())
    est = r.estimates
    assert int(r.dataset.train.n.sum()) == 24
    half = (est["ci_hi"] - est["estimate"]) / est["se"]
    np.testing.assert_allclose(half, t.ppf(0.975, 19), rtol=1e-10)
    np.testing.assert_allclose(est["estimate"] - est["ci_lo"], half * est["se"], rtol=1e-10)
    assert t.ppf(0.975, 19) > pers.z_value(0.95) + 0.1          # not the normal quantile


def test_oneshot_intervals_use_welch_satterthwaite_degrees_of_freedom():
    """strategy=oneshot averages M = 4 clients' least squares: var = sum_i se_i^2 / 16, and
    its degrees of freedom are (sum_i se_i^2)^2 / sum_i se_i^4 / nu_i, nu_i = n_i - 5 (each
    client's own residual variance), computed here from the clients' statistics."""
    from scipy.stats import t

    r = execute(compose_cfg("system=synthetic", "strategy=oneshot", "R=1", "repeats=1", "M=4",
                            "N=2", "T=5", "output.plot=false"), choices={}, given=frozenset())
    d = r.dataset.train
    _, se, _, _ = pers.least_squares_intervals(d.H, d.b, d.yy_target, d.n,
                                               pers.noise_blocks(r.model.structure))
    v = se[0] ** 2                                                       # (M, p)
    nu = d.n[0][:, None] - 5
    ws = v.sum(0) ** 2 / (v ** 2 / nu).sum(0)
    assert (ws > nu.min()).all() and (ws < nu.sum()).all()
    est = r.estimates
    np.testing.assert_allclose((est["ci_hi"] - est["estimate"]) / est["se"],
                               t.ppf(0.975, ws), rtol=1e-10)


def test_finetune_takes_k_local_steps_from_the_server_model():
    settings, model, optimizer, strategy = make("system=synthetic", "personalize=finetune",
                                                "personalize.K=3", "R=2", "repeats=1", "M=3")
    r = execute(compose_cfg("system=synthetic", "personalize=finetune", "personalize.K=3",
                            "R=2", "repeats=1", "M=3", "output.plot=false"),
                choices={}, given=frozenset())
    d = r.dataset.train
    theta = np.broadcast_to(r.estimate, r.client_models.shape).copy()
    for _ in range(3):                                  # three plain gradient steps (sum)
        theta = theta - settings.lr * (np.einsum("smpq,smq->smp", d.H, theta) - d.b)
    np.testing.assert_allclose(r.client_models, theta, rtol=1e-10)
    assert np.isnan(r.client_se).all()
    assert r.summary["personalize_finetune"] == {"K": 3, "lr": settings.lr}   # what it took
    assert "personalize_reml" not in r.summary


def test_bad_personalize_settings_are_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"output.ci_level must be a finite number in \(0, 1\)"):
        execute(compose_cfg("system=synthetic", "output.ci_level=1"), choices={},
                given=frozenset())
    out = tmp_path / "run"
    r = cli_in_process("personalize=often", f"hydra.run.dir={out}")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "fnsysid: error: personalize=often is not an option; allowed: auto, finetune, none"]
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.flower
@pytest.mark.skipif(not __import__("fnsysid.runtimes.check", fromlist=["x"]).flower_installed(),
                    reason="Flower is not installed (pip install -e '.[flower]')")
@pytest.mark.parametrize("option", ["auto", "finetune"])
def test_flower_clients_compute_the_personalized_models_of_the_inprocess_run(option, tmp_path):
    """Under runtime=flower each ClientApp computes its own model from its own data and the
    server's reply; the models, their intervals and errors equal the in-process ones (the
    server never sees the truth: the truth column is empty)."""
    from fnsysid.app.experiment import run_experiment

    args = ["system=synthetic", "M=4", "R=3", "repeats=2", "eps=1", "N=[3,5,2,4]", "lr=2e-3",
            "output.plot=false", f"personalize={option}"]
    run_experiment(compose_cfg(*args), tmp_path / "a")
    run_experiment(compose_cfg(*args, "runtime=flower"), tmp_path / "b")
    import json

    import pandas as pd

    ca, cb = (pd.read_csv(tmp_path / d / "client_estimates.csv") for d in "ab")
    sa, sb = (json.loads((tmp_path / d / "summary.json").read_text()) for d in "ab")
    ra, rb = sa.get("personalize_reml"), sb.get("personalize_reml")
    assert (ra is None) == (rb is None)
    if ra is not None:          # the test's statistics agree to rounding, the rest exactly
        for k in ("Q", "pvalue"):
            np.testing.assert_allclose(np.array(rb.pop(k), float), np.array(ra.pop(k), float),
                                       rtol=1e-7)
        assert ra == rb
    # a converged REML is determined to its tolerance, not to rounding (the two runs' equal
    # statistics differ by rounding: 1e-9 in se here); the intervals of a repeat whose REML
    # did not converge (flagged in the summary) are its last iterate, which those rounding
    # differences move through SQUAREM's accept/reject choices (by 7e-4 here)
    conv = np.asarray(sa["personalize_reml"]["converged"] if option == "auto" else [True] * 2)
    ok = conv[ca["repeat"].to_numpy()]
    for col in ("estimate", "se", "ci_lo", "ci_hi", "local", "local_se"):
        np.testing.assert_allclose(cb[col][ok], ca[col][ok], rtol=1e-7, atol=1e-12)
        np.testing.assert_allclose(cb[col], ca[col], rtol=1e-2, atol=1e-12)
    assert ok.any()
    assert cb["truth"].isna().all() and ca["truth"].notna().all()
    ea, eb = (pd.read_csv(tmp_path / d / "errors.csv") for d in "ab")
    np.testing.assert_allclose(eb["e_pers_mean"], ea["e_pers_mean"], rtol=1e-9)
    np.testing.assert_allclose(eb["e_pers_max"], ea["e_pers_max"], rtol=1e-9)
    assert ea["e_pers_mean"].notna().sum() == 2


@pytest.mark.slow
def test_pooled_intervals_cover_the_truth_95_percent_of_the_time_without_heterogeneity():
    """eps = 0, M = 20, N = 10, 200 repeats: the 95 % intervals of pooled least squares
    cover the truth in 93-97 % of the 3000 (repeat, parameter) pairs (binomial standard
    deviation 0.4 %)."""
    r = execute(compose_cfg("system=synthetic", "eps=0", "repeats=200", "R=1",
                            "strategy=centralized_exact", "output.plot=false", "data.val_N=0"),
                choices={}, given=frozenset())
    est = r.estimates
    inside = (est["ci_lo"] <= est["true_mean"]) & (est["true_mean"] <= est["ci_hi"])
    assert len(inside) == 3000
    assert 0.93 <= inside.mean() <= 0.97


@pytest.mark.slow
@pytest.mark.parametrize("lr, final", [("0.05", "finite"), ("1e10", "infinite")])
def test_personalized_models_are_judged_like_the_servers(lr, final, tmp_path):
    """finetune with a step that blows up: the server's model is ok, the personalized models
    are `diverged` (their own status line, exit 3, summary.client_models), an error that is
    not finite is listed in null_values, and numpy's overflow warnings are not printed."""
    import json

    out = tmp_path / "run"
    r = cli_in_process("system=synthetic", "M=3", "R=5", "personalize=finetune",
                       f"personalize.lr={lr}", "output.plot=false", f"hydra.run.dir={out}")
    assert r.returncode == 3
    assert "RuntimeWarning" not in r.stderr
    lines = [x for x in (r.stdout + r.stderr).splitlines() if "personalized models" in x and
             "diverged" in x]
    assert len(lines) == 1 and "personalize.lr" in lines[0]
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "ok"                               # the server's model
    assert s["client_models"]["personalized"]["status"] == "diverged"
    assert s["client_models"]["local"]["status"] == "ok"
    ce = np.genfromtxt(out / "client_estimates.csv", delimiter=",", names=True)
    if final == "finite":
        assert s["client_models"]["personalized"]["final"] > 1e3 * 1.0
        assert np.nanmax(np.abs(ce["estimate"])) > 1e9
    else:
        assert s["final_e_pers_max_mean"] is None
        assert "final_e_pers_max_mean" in s["null_values"]


@pytest.mark.slow
def test_a_healthy_personalization_is_ok_with_exit_0(tmp_path):
    import json

    out = tmp_path / "run"
    r = cli_in_process("system=synthetic", "M=3", "R=5", "personalize=auto",
                       "strategy=centralized_exact", "output.plot=false",
                       f"hydra.run.dir={out}")
    assert r.returncode == 0
    s = json.loads((out / "summary.json").read_text())
    assert {k: v["status"] for k, v in s["client_models"].items()} == {
        "personalized": "ok", "local": "ok"}


def test_client_models_are_judged_by_the_servers_rules():
    from fnsysid.results.personal import _judged

    models = np.ones((2, 3, 4))
    e = np.full((2, 3), 0.5)
    assert _judged(models, e, 0.2, False)["status"] == "ok"
    e[1, 2] = 20.0                                     # above 10 x max(1, start)
    j = _judged(models, e, 0.2, False)
    assert (j["status"], j["repeat"], j["client"], j["final"]) == ("growing", 1, 2, 20.0)
    e[0, 1] = 2e3                                      # above 1000 x max(1, start)
    assert _judged(models, e, 0.2, False)["status"] == "diverged"
    assert _judged(models, e, 3.0, False)["status"] == "growing"   # 2e3 < 3000
    local = models.copy()
    local[0, 0] = np.nan                               # a client its data do not determine
    assert _judged(local, np.full((2, 3), np.nan), 0.2, True)["status"] == "ok"
    assert _judged(local, np.full((2, 3), np.nan), 0.2, False)["status"] == "diverged"
    local[1, 1, 0] = np.inf
    assert _judged(local, np.full((2, 3), np.nan), 0.2, True)["status"] == "diverged"
    # the clients' own least squares are a closed form: not said to have diverged
    from fnsysid.results.personal import judgment_line

    j = dict(status="diverged", final=3510.0, repeat=3, client=10, factor=1000.0, start=0.2748)
    line = judgment_line("local", "auto", j)
    assert line.startswith("the clients' own least squares (local) are not a result: an error "
                           "3.51e+03 (repeat 3, client 10) above 1000 times max(1, the start "
                           "0.2748), where a fit's data hardly determine it")
    assert " diverged:" not in line and line.endswith(
        "they are a diagnostic in client_estimates.csv (local), not the run's models, whose "
        "status this does not change")
    assert judgment_line("personalized", "finetune", j).startswith(
        "personalized models (personalize=finetune) diverged: an error 3.51e+03")


@pytest.mark.slow
def test_a_sweep_with_diverged_client_models_exits_3(tmp_path):
    r = cli_in_process("-m", "system=synthetic", "M=3", "R=2", "repeats=1",
                       "personalize=finetune", "personalize.lr=0.05,1e-6",
                       "output.plot=false", "hydra.launcher.n_jobs=1",
                       f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert r.returncode == 3
    assert "client models personalized diverged" in r.stderr


def test_duffing_script_recovers_the_truth_and_auto_is_pooled_on_an_identical_fleet():
    """scripts/personalized_duffing.py: without noise every client's own least squares is the
    script's true coefficients (so its data and truth agree); with noise, on identical
    clients, auto equals pooled least squares computed here from the same fleet."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "personalized_duffing.py"
    spec = importlib.util.spec_from_file_location("personalized_duffing", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    X, Y, names = mod.fleet(np.random.default_rng(3), M=2, N=3, T=40, noise=0.0)
    true = mod.truth(names).reshape(2, -1)
    for m in range(2):
        own = np.linalg.lstsq(X[m], Y[m], rcond=None)[0].T
        np.testing.assert_allclose(own, true, atol=1e-9)
    r = mod.one_seed(0, M=2, N=2, T=50, noise=0.5)     # auto's REML: ~0.3 s (M=5: ~7 s)
    X, Y, names = mod.fleet(np.random.default_rng(0), 2, 2, 50, 0.5)
    pooled = np.linalg.lstsq(X.reshape(-1, X.shape[-1]), Y.reshape(-1, 2), rcond=None)[0].T
    assert r["pooled"] == pytest.approx(((pooled.ravel() - mod.truth(names)) ** 2).mean(),
                                        rel=1e-8)
    assert r["auto"] == pytest.approx(r["pooled"], rel=1e-8) and r["local"] > 10 * r["pooled"]


@pytest.mark.slow
def test_auto_on_a_shared_support_is_auto_on_the_kept_terms_alone():
    """personalize=auto with sparsity (group sparsity: the server's support shared, each
    client's own values): for each set of repeats with one support, auto on the statistics of
    the kept terms alone, the pruned terms exactly 0 with no standard error; on a support of
    every term, auto itself; repeats with other supports get their own fleets."""
    import fnsysid
    from fnsysid.results.personal import auto_on_support, own_sse, target_stats

    res = fnsysid.run({"system": "synthetic", "M": 8, "N": 6, "T": 10, "eps": 1.0, "R": 1,
                       "repeats": 3, "strategy": "centralized_exact", "output.plot": False,
                       "progress": False})
    model, data = res.model, res.dataset.train
    S, M, p = data.b.shape
    yy, blocks = target_stats(model, data)
    every = np.ones((S, p), bool)
    models, se, reml = auto_on_support(model, data, every)
    ref_m, ref_se, fl = pers.auto(data.H, data.b, yy, data.n, blocks, sse=own_sse(model, data))
    # the own fits on a support of every term round differently; the REML's iterations
    # carry that to ~1e-8 of the standard errors
    np.testing.assert_allclose(models, ref_m, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(se, ref_se, rtol=1e-6)
    assert reml["rejected"] == [bool(v < pers.HOMOGENEITY_LEVEL) for v in fl.pvalue]
    rng = np.random.default_rng(0)
    support = rng.random((S, p)) < 0.7
    support[1] = support[0]                       # repeats 0 and 1 share one support
    support[2, :] = True
    support[2, :3] = False
    models, se, reml = auto_on_support(model, data, support)
    assert (models[~np.broadcast_to(support[:, None], models.shape)] == 0).all()
    assert np.isnan(se[~np.broadcast_to(support[:, None], se.shape)]).all()
    for rows in ([0, 1], [2]):
        idx = np.flatnonzero(support[rows[0]])
        sub = pers.NoiseBlocks(blocks.param_block[idx], blocks.n_targets, blocks.targets)
        sse = own_sse(model, data, support[:, None, :])[rows]
        m, e, fl = pers.auto(data.H[rows][..., idx[:, None], idx], data.b[rows][..., idx],
                             yy[rows], data.n[rows], sub, sse=sse)
        np.testing.assert_allclose(models[rows][..., idx], m, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(se[rows][..., idx], e, rtol=1e-10)
        assert [reml["Q"][r] for r in rows] == pytest.approx(list(fl.Q))
    assert len(reml["converged"]) == S and reml["test"] == "Cochran's Q"


@pytest.mark.slow
def test_a_sparse_run_personalizes_on_its_support(tmp_path):
    """A run with sparsity=stlsq and personalize=auto: client_estimates.csv has 0 and no
    interval for the pruned terms, each client's own values on the kept ones, and the local
    fits on the support too (under runtime=flower: tests/test_flower.py)."""
    import fnsysid

    args = {"system": "synthetic", "M": 8, "N": 6, "T": 10, "eps": 1.0, "R": 1, "repeats": 2,
            "strategy": "centralized_exact", "sparsity": "stlsq", "personalize": "auto",
            "output.plot": False, "progress": False}
    res = fnsysid.run(args)
    ce = res.tables["client_estimates"]
    pruned = ce["parameter"].isin(
        res.estimates.loc[res.estimates["estimate"] == 0, "parameter"].unique())
    assert pruned.any() and (~pruned).any()
    assert (ce.loc[pruned, "estimate"] == 0).all() and ce.loc[pruned, "se"].isna().all()
    assert (ce.loc[pruned, "local"] == 0).all() and ce.loc[pruned, "local_se"].isna().all()
    assert ce.loc[~pruned, "se"].notna().all()
    assert res.summary["status"] == "ok" and res.summary["final_e_pers_mean_mean"] > 0



def test_a_flower_client_computes_its_personalization_message_once_per_support():
    """Under runtime=flower both exchanges after the last round (``personalize_stats``, then
    ``personalize``) read the same message: the node computes it once per support."""
    from types import SimpleNamespace

    from fnsysid.runtimes import flower_personal as fp

    model, d = _fleet(0.5, repeats=2, M=1)
    node = SimpleNamespace(model=model, data=d)
    first = fp._message(node, None)
    assert fp._message(node, None)[2] is first[2]
    support = np.ones((2, model.p), bool)
    support[:, 0] = False
    sparse = fp._message(node, support)
    assert sparse[2] is not first[2]
    np.testing.assert_array_equal(sparse[2].H[..., 0, :], 0.0)
    assert fp._message(node, support)[2] is sparse[2]
    assert fp._message(node, None)[2] is not sparse[2]


def test_group_sparsity_messages_carry_the_kept_terms_alone():
    """Under runtime=flower a group-sparsity message holds each repeat's kept terms in their
    order, padded to the most any repeat keeps; unpacked, the full-size arrays come back with
    0 for the pruned terms."""
    from fnsysid.results.personal import pack_kept, unpack_kept

    rng = np.random.default_rng(2)
    support = np.array([[1, 0, 1, 1, 0], [0, 1, 0, 0, 0], [0, 0, 0, 0, 0]], bool)
    H = rng.normal(size=(3, 4, 5, 5)) * (support[:, None, :, None] & support[:, None, None, :])
    b = rng.normal(size=(3, 4, 5)) * support[:, None, :]
    Hk, bk = pack_kept(H, support, 2), pack_kept(b, support, 1)
    assert Hk.shape == (3, 4, 3, 3) and bk.shape == (3, 4, 3)
    np.testing.assert_array_equal(Hk[0], H[0][:, [0, 2, 3]][:, :, [0, 2, 3]])
    np.testing.assert_array_equal(Hk[1, :, :1, :1], H[1][:, 1:2, 1:2])
    assert (Hk[1, :, 1:] == 0).all() and (Hk[2] == 0).all() and (bk[1, :, 1:] == 0).all()
    np.testing.assert_array_equal(unpack_kept(Hk, support, 2), H)
    np.testing.assert_array_equal(unpack_kept(bk, support, 1), b)
    mu = rng.normal(size=(3, 5)) * support                      # the fleet's (S, p)
    np.testing.assert_array_equal(unpack_kept(pack_kept(mu, support, 1), support, 1), mu)


@pytest.mark.slow
def test_auto_without_two_determined_clients_says_so_and_gives_no_intervals(caplog):
    """N=1, T=3: three samples a client for five coefficients a target, so no own fit and no
    homogeneity test (p-value null). The personalized models are the pooled model, whose
    intervals covered the clients' own truths about half the time (eps=5) beside a log line
    of "heterogeneity found in 0 of 2": the run now warns, says the test was not run, and
    client_estimates.csv has no se there. With N=2 (one residual degree of freedom a client)
    the test runs and the intervals stay."""
    from tests.conftest import engine

    caplog.set_level("INFO", logger="fnsysid")
    base = ("system=synthetic", "strategy=centralized_exact", "personalize=auto", "eps=5",
            "T=3", "repeats=2", "R=1", "output.plot=false", "progress=false")
    res = engine(*base, "N=1")
    reml = res.summary["personalize_reml"]
    assert reml["pvalue"] == [None, None] and reml["rejected"] == [False, False]
    se = np.asarray(res.tables["client_estimates"]["se"], float)
    assert np.isnan(se).all()
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"
            and "neither tested nor estimated" in r.getMessage()]
    assert len(said) == 1 and "in repeat(s) 0, 1 fewer than two clients" in said[0]
    assert "neither tested" in res.summary["ci"]["client_estimates"]
    from fnsysid.results.personal import reml_line

    assert reml_line(reml).startswith("personalize=auto: the clients' differences were not "
                                      "testable in any of the 2 repeat(s)")
    part = {**reml, "pvalue": [0.01, None], "rejected": [True, False]}
    assert reml_line(part).startswith("personalize=auto: heterogeneity found in 1 of 1 tested "
                                      "repeat(s) (Cochran's Q at level 0.05; not testable in 1 "
                                      "more, see the warning;")
    caplog.clear()
    two = engine(*base, "N=2")
    assert None not in two.summary["personalize_reml"]["pvalue"]
    se = np.asarray(two.tables["client_estimates"]["se"], float)
    assert np.isfinite(se).all() and (se > 0).all()
    assert not [r for r in caplog.records if "neither tested" in r.getMessage()]


@pytest.mark.slow
def test_a_heterogeneity_found_among_few_clients_is_said_to_be_uncertain(caplog):
    """Heterogeneity found among 10 clients' own fits: its variances are known to about
    sqrt(2 / 9) = 47 %, which the intervals take as known (a Duffing fleet on its support
    covered 89 % at 10 clients, a linear fleet 96 %); a warning says so, and not at 30
    clients or more."""
    from fnsysid.results.personal import SMALL_FLEET
    from tests.conftest import engine

    caplog.set_level("WARNING", logger="fnsysid")
    base = ("system=synthetic", "strategy=centralized_exact", "personalize=auto", "eps=1",
            "repeats=1", "R=1", "output.plot=false", "progress=false")
    few = engine(*base, "M=10").summary
    assert few["personalize_reml"]["rejected"] == [True]
    said = [r.getMessage() for r in caplog.records if "estimated from" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(
        "personalize=auto: the heterogeneity was estimated from 10 clients' own fits, its "
        "variances only to about 47 % (sqrt(2 / (m - 1)))")
    assert "how well they hold their level then depends on the fleet" in said[0]
    assert "estimated from 10 clients" in few["ci"]["client_estimates"]
    caplog.clear()
    many = engine(*base, f"M={SMALL_FLEET}").summary
    assert many["personalize_reml"]["rejected"] == [True]
    assert not [r for r in caplog.records if "estimated from" in r.getMessage()]


@pytest.mark.slow
def test_auto_on_data_that_escape_says_it_broke_down_instead_of_a_traceback(tmp_path):
    """A Duffing fleet of scripts/coverage_few_clients.py (seed 14) whose one trajectory
    escapes to 4e13: on its sparse support auto's heterogeneity reached 6e126 in the scaled
    parameters and a solve raised LinAlgError, a traceback. Now a warning, no personalized
    models (judged not finite), exit 3 beside the run's ill_conditioned status."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "coverage_few_clients.py"
    spec = importlib.util.spec_from_file_location("coverage_few_clients", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    folder = tmp_path / "fleet"
    folder.mkdir()
    with np.errstate(all="ignore"):
        script.fleet(folder, 10, 0.3, 14)
    out = tmp_path / "run"
    res = cli_in_process("system=generic", "data=files", f"data.path={folder}",
                         "data.states=[x1,x2]", "data.inputs=[u]", "data.trajectory=run",
                         "data.time=time", "feature_map=polynomial", "feature_map.degree=3",
                         "strategy=centralized_exact", "sparsity=stlsq", "personalize=auto",
                         "output.plot=false", "progress=false", f"hydra.run.dir={out}")
    text = res.stdout + res.stderr
    assert res.returncode == 3 and "Traceback" not in text, text[-2000:]
    assert "personalize=auto: a matrix of its fleet computation is singular" in text
    assert "personalized models (personalize=auto) diverged: a model not finite" in text


@pytest.mark.slow
def test_own_least_squares_that_are_poor_do_not_make_the_run_exit_3(tmp_path):
    """Three clients of one trajectory (5 samples for 5 coefficients a target) beside two of
    eight: the personalized models err by at most 0.25, one own fit by 14.8. The own fits are
    a diagnostic: status ``poor``, a warning, exit 0 (it was ``growing``, exit 3)."""
    import json

    r = cli_in_process("system=linear", "personalize=auto", "M=5", "R=5", "repeats=3",
                       "eps=0.5", "N=[1,1,1,8,8]", "output.plot=false",
                       f"hydra.run.dir={tmp_path}")
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    local, pers_ = s["client_models"]["local"], s["client_models"]["personalized"]
    assert local["status"] == "poor" and local["final"] > 10
    assert pers_["status"] == "ok" and pers_["final"] < 1
    out = r.stdout + r.stderr
    assert "[WARNING] the clients' own least squares (local) are not a result" in out
