"""Strategies beyond FedAvg against closed forms: lstsq, pooled solution, special cases."""

import numpy as np
import pytest

from fnsysid.dynamics.model import centred_stats, generate, least_squares, pooled
from fnsysid.learning.optim import GD, SGD
from fnsysid.learning.strategies import (
    Centralized,
    Cyclic,
    FedAvg,
    FedLin,
    FedProx,
    Local,
    OneShot,
    Scaffold,
)
from tests.conftest import make


def _data(system="synthetic", M=4, N=5, eps=0.2, repeats=2, seed=0, keep=True):
    cfg, model, *_ = make(f"system={system}")
    return model, generate(model, M=M, N=N, T=5, eps=eps, repeats=repeats, seed=seed,
                           keep_samples=keep)


def _run(strategy, model, data, optimizer, K=3, lr=1e-3, R=10, theta0=None):
    theta0 = np.zeros((data.shape[0], model.p)) if theta0 is None else theta0
    strategy.setup(theta0, data, model, optimizer, K, lr, seed=0)
    for r in range(1, R + 1):
        strategy.round(r)
    return strategy


def _lstsq(model, Phi, Y, mask):
    """Least squares from raw samples with numpy.linalg.lstsq (vec(Theta) regression)."""
    keep = mask > 0
    X = np.einsum("nk,jkp->njp", Phi[keep], model.structure).reshape(-1, model.p)
    return np.linalg.lstsq(X, Y[keep].reshape(-1), rcond=None)[0]


def test_oneshot_is_the_average_of_per_client_lstsq():
    model, d = _data()
    s = _run(OneShot(), model, d, GD(), R=3)
    ref = np.array([[_lstsq(model, d.Phi[r, m], d.Y[r, m], d.mask[r, m]) for m in range(4)]
                    for r in range(2)]).mean(axis=1)
    np.testing.assert_allclose(s.server, ref, rtol=1e-9, atol=1e-11)


def test_oneshot_leaves_out_clients_whose_data_do_not_determine_their_model():
    """4 clients: one without data (H = 0, b = 0), and in repeat 1 another whose Gram matrix
    has rank 1 (too few samples). The average is over the others to 1e-12, the others named
    in ``left_out``; uniform and sample weighting alike."""
    from dataclasses import replace

    model, d = _data(M=4, keep=False)
    H, b, n = d.H.copy(), d.b.copy(), d.n.copy()
    H[:, 2], b[:, 2], n[:, 2] = 0.0, 0.0, 0
    v = d.b[1, 1] / np.linalg.norm(d.b[1, 1])
    H[1, 1] = 3.0 * np.outer(v, v)                                  # rank 1 of p
    data = replace(d, H=H, b=b, n=n)
    own = least_squares(d.H, d.b)                                   # the full-rank clients'
    for weighting in ("uniform", "samples"):
        s = _run(OneShot(weighting=weighting), model, data, GD(), R=1)
        keep = [[0, 1, 3], [0, 3]]
        w = [np.ones(3), np.ones(2)] if weighting == "uniform" else [n[0, k] for k in keep]
        ref = np.array([np.average(own[r, k], axis=0, weights=w[r]) for r, k in enumerate(keep)])
        np.testing.assert_allclose(s.server, ref, rtol=0, atol=1e-12)
        assert s.left_out.tolist() == [[False, False, True, False], [False, True, True, False]]
    full = _run(OneShot(), model, d, GD(), R=1)                     # all determined: the mean
    assert not full.left_out.any()
    np.testing.assert_allclose(full.server, own.mean(axis=1), rtol=0, atol=1e-12)


def test_oneshot_refuses_a_repeat_where_no_client_determines_its_model():
    from dataclasses import replace

    from fnsysid.config.errors import ConfigError

    model, d = _data(M=2, keep=False)
    H = d.H.copy()
    H[1] = 0.0                                                      # repeat 1: no data at all
    with pytest.raises(ConfigError, match=r"strategy=oneshot: no client's own data determine "
                                          r"its least-squares model in repeat 1 \(every "
                                          r"client's Gram matrix has rank below the \d+ "
                                          r"parameters, from at most 25 samples each"):
        _run(OneShot(), model, replace(d, H=H), GD(), R=1)


def test_centralized_exact_is_pooled_lstsq_and_gd_approaches_it():
    model, d = _data()
    exact = _run(Centralized(exact=True), model, d, GD(), R=1).server
    P = pooled(d)
    ref = np.array([_lstsq(model, P.Phi[r, 0], P.Y[r, 0], P.mask[r, 0]) for r in range(2)])
    np.testing.assert_allclose(exact, ref, rtol=1e-9, atol=1e-11)
    gd = _run(Centralized(), model, d, GD(reduction="mean"), K=10, lr=0.2, R=200).server
    np.testing.assert_allclose(gd, ref, atol=1e-8)


def test_fedprox_with_zero_mu_equals_fedavg():
    model, d = _data()
    a = _run(FedProx(mu=0.0), model, d, GD(), K=4, lr=2e-3).server
    b = _run(FedAvg(), model, d, GD(), K=4, lr=2e-3).server
    np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    c = _run(FedProx(mu=5.0), model, d, GD(), K=4, lr=2e-3).server
    assert np.abs(c - b).max() > 1e-6                     # the proximal term does act


@pytest.mark.parametrize("strategy", [FedLin, Scaffold])
def test_drift_corrected_strategies_reach_the_centralized_solution_at_eps_0(strategy):
    model, d = _data(M=5, N=3, eps=0.0)
    target = least_squares(pooled(d).H, pooled(d).b)[:, 0]
    kw = dict(K=10, lr=0.1, R=400)
    fixed = _run(strategy(), model, d, GD(reduction="mean"), **kw).server
    np.testing.assert_allclose(fixed, target, atol=1e-8)
    drift = _run(FedAvg(), model, d, GD(reduction="mean"), **kw).server
    assert np.abs(drift - target).max() > 1e-3            # FedAvg stops elsewhere (K > 1)


def test_scaffold_with_feature_scaling_still_reaches_the_pooled_solution():
    model, d = _data(system="pendulum", M=4, N=4, eps=0.0)
    target = least_squares(pooled(d).H, pooled(d).b)[:, 0]
    opt = GD(reduction="mean", scale_features=True)
    got = _run(Scaffold(), model, d, opt, K=5, lr=0.1, R=3000).server
    np.testing.assert_allclose(got, target, rtol=1e-6)


def test_cyclic_with_one_client_equals_fedavg():
    model, d = _data(M=1)
    for opt in (lambda: GD(), lambda: SGD(batch_size=7)):
        a = _run(Cyclic(), model, d, opt(), K=3).server
        b = _run(FedAvg(), model, d, opt(), K=3).server
        np.testing.assert_allclose(a, b, rtol=1e-13)


def test_cyclic_runs_clients_in_sequence():
    model, d = _data(M=3)
    got = _run(Cyclic(), model, d, GD(), K=2, R=1).server
    theta = np.zeros((2, model.p))
    for m in range(3):
        for _ in range(2):
            theta = theta - 1e-3 * (np.einsum("spq,sq->sp", d.H[:, m], theta) - d.b[:, m])
    np.testing.assert_allclose(got, theta, rtol=1e-13)


def test_local_clients_converge_to_their_own_least_squares():
    model, d = _data(M=3)
    s = _run(Local(), model, d, GD(reduction="mean"), K=10, lr=0.2, R=300)
    assert s.estimate().shape == d.theta_true.shape
    np.testing.assert_allclose(s.estimate(), least_squares(d.H, d.b), atol=1e-8)


def test_strategy_options_are_checked():
    with pytest.raises(ValueError, match="strategy.mu"):
        FedProx(mu=-1)
    with pytest.raises(ValueError, match="strategy.weighting"):
        FedAvg(weighting="median")


@pytest.mark.slow
@pytest.mark.parametrize("system", ["pendulum", "synthetic", "linear", "quadrotor"])
def test_every_strategy_runs_on_every_system(system, tmp_path):
    from fnsysid.app.experiment import run_experiment
    from fnsysid.config.groups import options
    from tests.conftest import compose_cfg

    for strategy in options("strategy"):
        cfg = compose_cfg(f"system={system}", f"strategy={strategy}", "M=3", "R=3",
                          "repeats=2", "output.plot=false")
        summary = run_experiment(cfg, tmp_path / strategy)
        assert summary["status"] == "ok" and summary["rounds_completed"] == 3
        assert 0 < summary["final_e_max_mean"] < 10


def test_scaffold_with_whitening_reaches_the_pooled_solution():
    # 50 samples a client for p = 15: each client's whitening is well conditioned (with 15
    # samples, H_i^+ of one client can amplify another's gradient and the rounds diverge)
    model, d = _data(system="linear", M=4, N=10, eps=0.0)
    target = least_squares(pooled(d).H, pooled(d).b)[:, 0]
    opt = GD(reduction="mean", scale_features="whiten")
    got = _run(Scaffold(), model, d, opt, K=5, lr=0.1, R=300).server
    np.testing.assert_allclose(got, target, atol=1e-8)


@pytest.mark.slow
def test_oneshot_run_names_a_client_with_all_zero_data_and_averages_the_others(tmp_path,
                                                                              caplog):
    """Trajectory files of 4 clients, one all zeros: a warning and the summary name it, and
    the estimate is the one-shot average of the other three clients' files alone."""
    import logging

    import fnsysid
    from tests.test_data_files import GENERIC, linear_fleet, write_per_client

    df, _ = linear_fleet(n_clients=4, noise=0.05, seed=1)
    df.loc[df["client"] == "robot3", ["x1", "x2", "u"]] = 0.0
    write_per_client(df, tmp_path / "four")
    write_per_client(df[df["client"] != "robot3"], tmp_path / "three")
    run = [*GENERIC, "strategy=oneshot", "R=1"]
    with caplog.at_level(logging.WARNING, logger="fnsysid"):
        four = fnsysid.run([*run, f"data.path={tmp_path / 'four'}"])
    warned = [r.getMessage() for r in caplog.records if "strategy=oneshot" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith(
        "strategy=oneshot: 1 of 4 client(s) left out of the average") and \
        warned[0].endswith(": robot3")
    assert four.summary["left_out_clients"] == ["robot3"]
    caplog.clear()
    three = fnsysid.run([*run, f"data.path={tmp_path / 'three'}"])
    assert "left_out_clients" not in three.summary
    assert not [r for r in caplog.records if "strategy=oneshot" in r.getMessage()]
    np.testing.assert_allclose(four.estimates["estimate"], three.estimates["estimate"],
                               rtol=0, atol=1e-12)
    # its held-out data have no spread: left out of the NRMSE (named), which the other three
    # clients give, as without it (it was NaN, null in the summary, for every client)
    assert four.summary["unscored_clients"] == ["robot3"]
    assert "unscored_clients" not in three.summary
    cols = ["nrmse_1step_max", "nrmse_1step_mean", "nrmse_sim_max", "nrmse_sim_mean"]
    assert np.isfinite(four.errors[cols].to_numpy()).all()
    np.testing.assert_allclose(four.errors[cols], three.errors[cols], rtol=1e-12, atol=0)


@pytest.fixture(scope="module")
def fleet_with_a_zero_client(tmp_path_factory):
    """Folders of trajectory files: 4 clients of which robot3 is all zeros, and the other 3."""
    from tests.test_data_files import linear_fleet, write_per_client

    tmp = tmp_path_factory.mktemp("zero_client")
    df, _ = linear_fleet(n_clients=4, noise=0.05, seed=1)
    df.loc[df["client"] == "robot3", ["x1", "x2", "u"]] = 0.0
    return (write_per_client(df, tmp / "four"),
            write_per_client(df[df["client"] != "robot3"], tmp / "three"))


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fedavg", "fedprox", "fedlin", "fednova",
                                      "scaffold optimizer.scale_features=diagonal"])
def test_gradient_strategies_end_where_the_other_clients_put_them(strategy,
                                                                  fleet_with_a_zero_client):
    """A client with all-zero data returns the server model: the fixed point is the one of
    the other three clients alone."""
    import fnsysid
    from tests.test_data_files import GENERIC

    four, three = fleet_with_a_zero_client
    run = [*GENERIC, *f"strategy={strategy}".split(), "R=200"]
    a = fnsysid.run([*run, f"data.path={four}"]).estimates["estimate"]
    b = fnsysid.run([*run, f"data.path={three}"]).estimates["estimate"]
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


@pytest.mark.slow
def test_scaffold_with_whitening_refuses_a_client_without_full_rank(fleet_with_a_zero_client,
                                                                     tmp_path):
    """Whitening's H_i^+ cannot carry SCAFFOLD's correction where a client has no data (the
    run would end 0.09 away from the other clients' solution): refused in one line, nothing
    written; with full-rank clients the same settings run."""
    import fnsysid
    from fnsysid.config.errors import ConfigError
    from tests.test_data_files import GENERIC

    four, three = fleet_with_a_zero_client
    run = [*GENERIC, "strategy=scaffold", "optimizer.scale_features=whiten", "R=5"]
    with pytest.raises(ConfigError, match=r"^strategy=scaffold with optimizer.scale_features="
                                          r"whiten: 1 of 4 client\(s\) \(numbers 3, from 0 in "
                                          r"the data's order\) have data whose Gram matrix has "
                                          r"rank below the 6 parameters, .*; allowed: "):
        fnsysid.run([*run, f"data.path={four}"], output_dir=tmp_path / "four")
    assert not (tmp_path / "four").exists()
    assert fnsysid.run([*run, f"data.path={three}"]).summary["status"] == "ok"


def test_sgd_with_zscore_centres_the_features_not_the_targets():
    """A mini-batch step of SGD(zscore) is the gradient of the batch with the client's
    centred features and its raw targets, as GD(zscore) takes the full batch."""
    model, d = _data(M=3, N=5)
    opt = SGD(batch_size=3, reduction="mean", scale_features="zscore")
    opt.setup(d, model, seed=0)
    theta0 = np.random.default_rng(1).standard_normal((2, 3, model.p))
    got = opt.local_steps(theta0, 1, 0.1)
    sample = opt.perm[..., :3]                                  # the first batch of each client
    Phi = d.Phi - d.phi_mean[:, :, None, :]
    take = lambda a: np.take_along_axis(a, sample[..., None], axis=-2)   # noqa: E731
    Theta = np.einsum("jkp,smp->smjk", model.structure, theta0)
    resid = take(d.Y) - np.einsum("smnk,smjk->smnj", take(Phi), Theta)
    g = -np.einsum("jkp,smjk->smp", model.structure,
                   np.einsum("smnj,smnk->smjk", resid, take(Phi))) / 3
    Hc = centred_stats(d, model.structure)[0]
    want = theta0 - 0.1 * (d.n[..., None] / np.diagonal(Hc, axis1=-2, axis2=-1)) * g
    assert np.abs(d.y_mean).min() > 1e-3           # centring the targets would change the step
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    full = SGD(batch_size=100, reduction="mean", scale_features="zscore")   # > N T = 25
    full.setup(d, model, seed=0)
    gd = GD(reduction="mean", scale_features="zscore", affine=False)
    gd.setup(d, model, seed=0)
    np.testing.assert_allclose(full.local_steps(theta0, 2, 0.1), gd.local_steps(theta0, 2, 0.1),
                               rtol=1e-12)
