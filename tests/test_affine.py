"""K local GD steps as one affine map equal the step-by-step path (every strategy, system)."""

import numpy as np
import pytest

from fnsysid.dynamics.model import generate
from fnsysid.learning.optim import GD, LocalMap, affine_gd, gd_steps, step_sizes
from fnsysid.learning.strategies import (
    Centralized,
    Cyclic,
    FedAvg,
    FedLin,
    FedNova,
    FedProx,
    Local,
    Scaffold,
    aggregate,
    changed_rules,
)
from tests.conftest import make

STRATEGIES = {
    "fedavg": FedAvg, "fedprox": lambda: FedProx(mu=0.3), "fedlin": FedLin,
    "scaffold": Scaffold, "local": Local, "centralized": Centralized, "cyclic": Cyclic,
    "fedavg_samples": lambda: FedAvg(weighting="samples"), "fednova": FedNova,
}


def _rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def _trajectory(strategy, model, data, optimizer, K, lr, R):
    theta0 = np.zeros((data.shape[0], model.p))
    strategy.setup(theta0, data, model, optimizer, K, lr, seed=0)
    out = []
    for r in range(1, R + 1):
        strategy.round(r)
        out.append(np.broadcast_to(strategy.estimate(), data.theta_true.shape).copy())
    return np.array(out)


@pytest.mark.parametrize("system", ["pendulum", "synthetic", "linear", "quadrotor"])
def test_affine_rounds_equal_the_step_path_for_every_strategy(system):
    cfg, model, opt, _ = make(f"system={system}")
    data = generate(model, M=5, N=3, T=cfg.T, eps=0.1, repeats=2, seed=1)
    solver = {k: getattr(cfg.optimizer, k) for k in ("schedule", "reduction", "scale_features")}
    K, lr = max(int(cfg.K), 3), float(cfg.lr)
    for name, make_strategy in STRATEGIES.items():
        ref = _trajectory(make_strategy(), model, data, GD(affine=False, **solver), K, lr, 15)
        fast_strategy = make_strategy()
        got = _trajectory(fast_strategy, model, data, GD(**solver), K, lr, 15)
        assert np.isfinite(ref).all() and np.abs(ref[-1] - ref[0]).max() > 0, name
        assert _rel(got, ref) < 1e-10, (name, _rel(got, ref))


@pytest.mark.parametrize("options", [
    dict(schedule="inverse_k"), dict(scale_features="whiten", reduction="mean"),
    dict(scale_features="zscore", reduction="mean"), dict(scale_features="diagonal"),
])
def test_affine_rounds_equal_the_step_path_for_every_solver_option(options):
    cfg, model, *_ = make("system=synthetic")
    data = generate(model, M=4, N=3, T=5, eps=0.3, repeats=2, seed=2)
    lr = 1e-3 if options.get("reduction") != "mean" else 0.05
    for name, make_strategy in STRATEGIES.items():
        ref = _trajectory(make_strategy(), model, data, GD(affine=False, **options), 6, lr, 10)
        got = _trajectory(make_strategy(), model, data, GD(**options), 6, lr, 10)
        assert _rel(got, ref) < 1e-10, (name, options, _rel(got, ref))


@pytest.mark.parametrize("schedule", ["constant", "inverse_k"])
@pytest.mark.parametrize("K", [1, 2, 7, 50])
def test_affine_map_of_per_client_k_equals_the_steps(schedule, K):
    rng = np.random.default_rng(0)
    S, M, p = 2, 5, 3
    X = rng.standard_normal((S, M, 8, p))
    H, b = np.einsum("smnp,smnq->smpq", X, X), rng.standard_normal((S, M, p))
    n = np.full((S, M), 8.0)
    Ks = np.array([K, 1, 3, max(K - 1, 1), 2])             # per-client K_i
    theta, c = rng.standard_normal((S, 1, p)), rng.standard_normal((S, M, p))
    for kw in (dict(), dict(reduction="mean", precond=1.0 / np.diagonal(H, axis1=-2,
                                                                         axis2=-1), mu=0.5)):
        lrs = step_sizes(0.01, Ks, schedule)                # (M, max K), zeros past K_i
        ref = gd_steps(np.broadcast_to(theta, (S, M, p)), H, b, n, lrs, correction=c,
                       anchor=theta, **kw)
        got = affine_gd(H, b, n, 0.01, Ks, schedule=schedule, **kw)(theta, correction=c)
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14)
        for m in range(M):                                  # each client as if alone
            kw_m = {k: v[:, m] if k == "precond" else v for k, v in kw.items()}
            alone = gd_steps(theta[:, 0], H[:, m], b[:, m], n[:, m],
                             step_sizes(0.01, int(Ks[m]), schedule), correction=c[:, m],
                             anchor=theta[:, 0], **kw_m)
            np.testing.assert_allclose(got[:, m], alone, rtol=1e-12, atol=1e-14)


def test_server_map_of_fedavg_is_the_average_of_the_client_maps():
    cfg, model, *_ = make("system=linear")
    data = generate(model, M=3, N=2, T=5, eps=0.1, repeats=1, seed=0)
    s = FedAvg()
    s.setup(np.zeros((1, model.p)), data, model, GD(), 4, 1e-4, 0)
    client = s.optimizer.local_map(4, 1e-4)
    np.testing.assert_allclose(s.server_map.P[:, 0], client.P.mean(axis=1), rtol=1e-14)
    theta = np.ones((1, 1, model.p))
    np.testing.assert_allclose(s.server_map(theta)[:, 0], client(theta).mean(axis=1),
                               rtol=1e-12)


def test_sgd_and_stepping_gd_have_no_map():
    from fnsysid.learning.optim import SGD

    cfg, model, *_ = make("system=linear")
    data = generate(model, M=2, N=2, T=5, eps=0.1, repeats=1, seed=0, keep_samples=True)
    for opt in (SGD(batch_size=3), GD(affine=False)):
        opt.setup(data, model, 0)
        assert opt.local_map(3, 1e-3) is None
    with pytest.raises(ValueError, match="optimizer.affine"):
        GD(affine="yes")


@pytest.mark.parametrize("schedule", ["constant", "inverse_k"])
def test_affine_rounds_equal_the_step_path_with_per_client_k(schedule):
    cfg, model, *_ = make("system=synthetic")
    data = generate(model, M=4, N=3, T=5, eps=0.3, repeats=2, seed=3)
    Ks = np.broadcast_to([1, 3, 7, 2], (2, 4))               # per-client K_i, (S, M)
    for name in ("fedavg", "fedprox", "fednova", "scaffold", "local", "fedlin"):
        kw = dict(schedule=schedule, reduction="mean")
        ref = _trajectory(STRATEGIES[name](), model, data, GD(affine=False, **kw), Ks, 0.05, 10)
        got = _trajectory(STRATEGIES[name](), model, data, GD(**kw), Ks, 0.05, 10)
        assert np.abs(ref[-1] - ref[0]).max() > 0
        assert _rel(got, ref) < 1e-10, (name, _rel(got, ref))


def test_local_maps_do_not_depend_on_slices_or_threads(monkeypatch):
    """GD computes the clients' maps a slice of clients at a time on the data threads; the
    maps are those of one call over all clients, bit for bit."""
    from fnsysid.learning import optim

    cfg, model, *_ = make("system=synthetic")
    data = generate(model, M=50, N=2, T=cfg.T, eps=0.1, repeats=2, seed=1)
    opt = GD(scale_features="diagonal")
    opt.setup(data, model, seed=0)
    K = np.random.default_rng(0).integers(1, 6, (2, 50))
    whole = opt.local_map(K, 0.05, mu=0.1)
    monkeypatch.setattr(optim, "MAP_CHUNK", 7)
    monkeypatch.setenv("FNSYSID_THREADS", "2")
    sliced = opt.local_map(K, 0.05, mu=0.1)
    for a, b in ((whole.P, sliced.P), (whole.q, sliced.q), (whole.C, sliced.C)):
        np.testing.assert_array_equal(a, b)
    assert whole.P.shape == (2, 50, model.p, model.p)


class Damped(FedAvg):
    """A user's FedAvg whose server moves half way to the average."""

    def server_update(self, exchange, replies, sel=slice(None), active=None):
        self.server = 0.5 * (self.server + aggregate(replies["theta"]))


class Shrunk(FedAvg):
    """A user's FedAvg whose clients send their local models shrunk by 0.9."""

    def client_update(self, exchange, msg, clients, sel=slice(None)):
        return {"theta": 0.9 * super().client_update(exchange, msg, clients, sel)["theta"]}


class DampedAffine(Damped):
    """Damped with a server map of its own: the fast path is its to use."""

    def client_maps(self):
        maps = super().client_maps()
        if maps is None:
            return None
        return LocalMap(0.5 * (np.eye(maps.P.shape[-1]) + maps.P), 0.5 * maps.q)


class DeclaredAffine(Damped):
    """Damped that (wrongly) declares FedAvg's map to be its rounds."""

    affine = True


def test_a_users_update_rule_turns_the_server_map_off_and_changes_the_result(caplog):
    cfg, model, *_ = make("system=synthetic")
    data = generate(model, M=4, N=3, T=5, eps=0.3, repeats=2, seed=2)
    fedavg = _trajectory(FedAvg(), model, data, GD(), 6, 1e-3, 10)
    for cls in (Damped, Shrunk):
        s = cls()
        with caplog.at_level("INFO", logger="fnsysid"):
            got = _trajectory(s, model, data, GD(), 6, 1e-3, 10)       # the default: affine
        assert s.server_map is None
        assert f"overrides {changed_rules(cls)[0]} of FedAvg" in caplog.text
        ref = _trajectory(cls(), model, data, GD(affine=False), 6, 1e-3, 10)
        assert _rel(got, ref) < 1e-10
        assert _rel(got, fedavg) > 1e-3, cls                  # not FedAvg's numbers
    # damped by hand: theta_r = 0.5 theta_{r-1} + 0.5 mean_i (P_i theta_{r-1} + q_i)
    opt = GD()
    opt.setup(data, model, 0)
    mp = opt.local_map(6, 1e-3)
    theta = np.zeros((2, model.p))
    for _ in range(10):
        theta = 0.5 * theta + 0.5 * mp(theta[:, None, :]).mean(axis=1)
    np.testing.assert_allclose(_trajectory(Damped(), model, data, GD(), 6, 1e-3, 10)[-1, :, 0],
                               theta, rtol=1e-10)


def test_a_class_that_supplies_its_own_map_or_declares_itself_affine_keeps_the_fast_path():
    cfg, model, *_ = make("system=synthetic")
    data = generate(model, M=4, N=3, T=5, eps=0.3, repeats=2, seed=2)
    s = DampedAffine()
    got = _trajectory(s, model, data, GD(), 6, 1e-3, 10)
    assert s.server_map is not None and changed_rules(DampedAffine) == []
    ref = _trajectory(Damped(), model, data, GD(affine=False), 6, 1e-3, 10)
    assert _rel(got, ref) < 1e-10
    declared = DeclaredAffine()                         # its word is taken: FedAvg's map
    got = _trajectory(declared, model, data, GD(), 6, 1e-3, 10)
    assert declared.server_map is not None
    assert _rel(got, _trajectory(FedAvg(), model, data, GD(), 6, 1e-3, 10)) < 1e-12


def test_the_built_in_strategies_keep_their_server_map():
    cfg, model, *_ = make("system=synthetic")
    data = generate(model, M=4, N=3, T=5, eps=0.3, repeats=2, seed=2)
    for name in ("fedavg", "fedprox", "fedlin", "fednova", "fedavg_samples"):
        s = STRATEGIES[name]()
        assert changed_rules(type(s)) == [], name
        s.setup(np.zeros((2, model.p)), data, model, GD(), 6, 1e-3, 0)
        assert s.server_map is not None, name
    assert changed_rules(Scaffold) == []                 # per-client state: no server map


def test_a_users_scaffold_runs_its_exchanges_without_a_word_about_a_map(caplog):
    class Mine(Scaffold):
        def server_update(self, exchange, replies, sel=slice(None), active=None):
            super().server_update(exchange, replies, sel, active)

    cfg, model, *_ = make("system=synthetic")
    data = generate(model, M=4, N=3, T=5, eps=0.3, repeats=2, seed=2)
    with caplog.at_level("INFO", logger="fnsysid"):
        got = _trajectory(Mine(), model, data, GD(), 6, 1e-3, 5)
    assert "overrides" not in caplog.text
    assert _rel(got, _trajectory(Scaffold(), model, data, GD(), 6, 1e-3, 5)) < 1e-12


def test_a_whitened_map_of_a_full_rank_gram_matrix_is_the_exact_contraction():
    """With ``D = n H^+`` and the mean gradient, K steps map theta to ``(1 - lr)^K theta +
    (1 - (1 - lr)^K) H^+ b``: with ``whitened`` the map is that exactly; computed as ``D H``
    it is off by the Gram matrix's condition number times eps (an input about 1e6)."""
    from fnsysid.dynamics.model import equilibrated_pinv
    from fnsysid.learning.optim import preconditioner

    rng = np.random.default_rng(1)
    X = np.column_stack([np.ones(400), rng.normal(size=400), 1e6 + rng.normal(size=400)])
    y = X @ np.array([-2e4, 0.98, 0.02]) + 0.01 * rng.normal(size=400)
    H, b, n = (X.T @ X)[None], (X.T @ y)[None], np.array([400.0])
    D = preconditioner(H, n, "whiten")
    exact = affine_gd(H, b, n, 0.5, 5, reduction="mean", precond=D,
                      whitened=(np.array([[True, True, True]]), np.array([True])))
    np.testing.assert_array_equal(exact.P[0], 0.5 ** 5 * np.eye(3))
    own = equilibrated_pinv(H)[0] @ b[0]
    # H^+ b in another order (n H^+ times b, over n): equal to the precision of the closed
    # form, which the condition number limits
    np.testing.assert_allclose(exact.q[0], (1 - 0.5 ** 5) * own, rtol=1e-7)
    computed = affine_gd(H, b, n, 0.5, 5, reduction="mean", precond=D)
    assert np.abs(computed.P[0] - 0.5 ** 5 * np.eye(3)).max() > 1e-6
    # a regressor identically 0 (a pruned term, an input a client never moves): the map
    # contracts the others and leaves its coefficient where it is
    Z = X.copy()
    Z[:, 1] = 0.0
    H0, b0 = (Z.T @ Z)[None], (Z.T @ y)[None]
    D0 = preconditioner(H0, n, "whiten")
    live = np.array([[True, False, True]])
    held = affine_gd(H0, b0, n, 0.5, 5, reduction="mean", precond=D0,
                     whitened=(live, np.array([True])))
    np.testing.assert_array_equal(held.P[0], np.diag([0.5 ** 5, 1.0, 0.5 ** 5]))
    assert held.q[0, 1] == 0.0


def far_fleet(path, noise_input=False, zero_client=False):
    """Tanks ``x+ = 0.98 x + 0.02 d + 0.01 w`` whose input is ``u = 1e6 + d`` (d of spread 1),
    5 clients of 4 trajectories (the last held out); ``noise_input``: a second input ``u2``
    the tanks do not use, identically 0 in client c0 with ``zero_client``."""
    import pandas as pd

    rng = np.random.default_rng(0)
    rows = []
    for i in range(5):
        for j in range(4):
            d = rng.normal(size=101)
            x = np.empty(101)
            x[0] = rng.normal()
            for t in range(100):
                x[t + 1] = 0.98 * x[t] + 0.02 * d[t] + 0.01 * rng.normal()
            frame = {"client": f"c{i}", "trajectory": j, "t": np.arange(101),
                     "split": "val" if j == 3 else "train", "x1": x, "u": 1e6 + d}
            if noise_input:
                frame["u2"] = np.zeros(101) if zero_client and i == 0 else rng.normal(size=101)
            rows.append(pd.DataFrame(frame))
    file = path / f"far_{int(noise_input)}{int(zero_client)}.csv"
    pd.concat(rows).to_csv(file, index=False, float_format="%.17g")
    return file


@pytest.mark.slow
@pytest.mark.parametrize("noise_input, zero_client, extra", [
    (False, False, ()), (True, False, ("sparsity=stlsq",)), (True, True, ())],
    ids=["affine", "pruned_term", "zero_regressor"])
def test_whitened_maps_of_data_far_from_0_keep_the_steps_fixed_point(tmp_path, noise_input,
                                                                      zero_client, extra):
    """An affine library, the generic default (local steps whitened by each client's own Gram
    matrix), inputs about 1e6: the precomputed map took ``n H^+ H`` as computed, ``n I`` up
    to the Gram matrix's condition number (about 1e12 equilibrated) times eps, and its fixed
    point ended at one-step NRMSE 7.8 where the steps taken one by one give 0.076; so did a
    fleet whose unused input STLSQ prunes (11.8) or that one client never moves (2.5, the
    Gram matrices then not of full rank). ``D H`` is ``n`` times the 0/1 diagonal of the
    regressors that are not identically 0, exactly, where the Gram matrix has full rank on
    them."""
    from tests.conftest import engine

    file = far_fleet(tmp_path, noise_input, zero_client)
    args = ("system=generic", "data=files", f"data.path={file}", "data.states=[x1]",
            "data.inputs=[u,u2]" if noise_input else "data.inputs=[u]", "feature_map=affine",
            "output.plot=false", "progress=false", *extra)
    maps = engine(*args).summary
    steps = engine(*args, "optimizer.affine=false").summary
    assert steps["final_nrmse_1step_mean"] < 0.1
    assert maps["final_nrmse_1step_mean"] == pytest.approx(steps["final_nrmse_1step_mean"],
                                                           rel=1e-2)
