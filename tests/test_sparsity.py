"""sparsity=stlsq (federated sequentially thresholded least squares) and the model-class check,
on a held-out fleet of Duffing oscillators identified with a degree-3 polynomial library."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import fnsysid
from fnsysid.dynamics.features import Polynomial
from fnsysid.learning.sparsity import stlsq
from tests.conftest import engine

DT, DELTA, B = 0.05, 0.3, 1.0
#: the true support: x1+ = x1 + dt x2; x2+ = -dt alpha x1 + (1 - dt delta) x2 + dt b u
#: - dt beta x1^3
TRUE = {"x1+:x1", "x1+:x2", "x2+:x1", "x2+:x2", "x2+:u", "x2+:x1^3"}


def duffing_fleet(path, M=8, N=6, T=60, val=2, noise=0.1, seed=1):
    """A file of M Duffing oscillators (alpha, beta differ per client), N training and
    ``val`` held-out trajectories each (forward Euler, velocity disturbance ``noise``);
    returns the file and the pooled training samples (Phi of the degree-3 library, Y)."""
    rng = np.random.default_rng(seed)
    rows, X, Y = [], [], []
    lib = Polynomial(degree=3)
    for c in range(M):
        alpha, beta = 1.0 + 0.2 * rng.random(), 0.5 + 0.2 * rng.random()
        for j in range(N + val):
            x = np.empty((T + 1, 2))
            x[0] = rng.normal(size=2)
            u = rng.normal(size=T + 1)
            w = noise * rng.normal(size=T)
            for t in range(T):
                x1, x2 = x[t]
                x[t + 1] = (x1 + DT * x2,
                            x2 + DT * (-DELTA * x2 - alpha * x1 - beta * x1 ** 3 + B * u[t]
                                       + w[t]))
            split = "train" if j < N else "val"
            rows.append(pd.DataFrame({"client": f"c{c}", "trajectory": j, "t": np.arange(T + 1),
                                      "split": split, "x1": x[:, 0], "x2": x[:, 1], "u": u}))
            if split == "train":
                X.append(lib.transform(x[:-1], u[:-1, None]))
                Y.append(x[1:])
    file = path / "duffing.csv"
    pd.concat(rows).to_csv(file, index=False)
    return file, np.concatenate(X), np.concatenate(Y)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    return duffing_fleet(tmp_path_factory.mktemp("duffing"))


def run(file, *extra, degree=3, **kw):
    over = {"system": "generic", "data": "files", "data.path": str(file),
            "data.states": ["x1", "x2"], "data.inputs": ["u"], "feature_map": "polynomial",
            "feature_map.degree": degree, "output.plot": False, "progress": False, **kw}
    return engine(*[f"{k}={v}" if not isinstance(v, list) else f"{k}=[{','.join(v)}]"
                    for k, v in over.items()], *extra)


def kept(res) -> set[str]:
    est = res.estimates
    return set(est.loc[est["estimate"] != 0, "parameter"])


def test_stlsq_on_statistics_thresholds_refits_and_stops_when_the_support_is_stable():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 5))
    theta = np.array([1.0, 0.0, -0.3, 0.0, 0.05])
    y = X @ theta + 0.01 * rng.normal(size=200)
    coef, support, refits = stlsq(X.T @ X, X.T @ y, threshold=0.1)
    assert support.tolist() == [True, False, True, False, False]
    np.testing.assert_allclose(coef[support], np.linalg.lstsq(X[:, support], y, rcond=None)[0],
                               rtol=1e-12)
    assert (coef[~support] == 0).all() and refits == 2
    # batched over leading axes: each problem its own support
    H = np.stack([X.T @ X, 4 * X.T @ X])
    c2, s2, _ = stlsq(H, np.stack([X.T @ y, X.T @ y]), threshold=0.1)
    assert s2[0].tolist() == support.tolist() and s2[1].tolist() == [True] + [False] * 4


def test_stlsq_equals_pysindy_on_pooled_data(fleet):
    ps = pytest.importorskip("pysindy", reason="the comparison needs the [compare] extra "
                             "(pip install -e '.[compare]')")
    _, X, Y = fleet
    ref = ps.STLSQ(threshold=0.01, alpha=0.0).fit(X, Y).coef_            # (2, 20)
    coef, support, _ = stlsq(np.kron(np.eye(2), X.T @ X), (X.T @ Y).T.reshape(-1),
                             threshold=0.01)
    assert ((ref != 0) == support.reshape(2, -1)).all()
    np.testing.assert_allclose(coef.reshape(2, -1), ref, rtol=0, atol=1e-8)


@pytest.mark.slow
def test_centralized_exact_recovers_the_duffing_support_and_equals_pooled_stlsq(fleet):
    file, X, Y = fleet
    res = run(file, strategy="centralized_exact", sparsity="stlsq")
    assert kept(res) == TRUE                                 # 6 of 40 terms
    sp = res.summary["sparsity"]
    assert sp["support_size"] == {"x1+": 2, "x2+": 4} and (sp["terms"], sp["of"]) == (6, 40)
    # parameters in the order x1+ then x2+, each over the library's 20 features
    coef, _, _ = stlsq(np.kron(np.eye(2), X.T @ X), (X.T @ Y).T.reshape(-1), threshold=0.01)
    np.testing.assert_allclose(res.estimates["estimate"].to_numpy(), coef, rtol=0, atol=1e-8)
    # without sparsity every one of the 40 coefficients is non-zero
    assert len(kept(run(file, strategy="centralized_exact"))) == 40


def pooled_support(X, Y, threshold=0.01):
    """Pooled STLSQ's support (2, 20) of the training samples (the reference)."""
    _, support, _ = stlsq(np.kron(np.eye(2), X.T @ X), (X.T @ Y).T.reshape(-1), threshold)
    return support.reshape(2, -1)


@pytest.mark.parametrize("strategy", ["fedavg", "fednova", "fedprox", "cyclic", "centralized"])
def test_federated_stlsq_thresholds_the_pooled_solution(fleet, strategy):
    file, X, Y = fleet
    res = run(file, strategy=strategy, sparsity="stlsq", R=40)
    assert kept(res) == TRUE and res.summary["status"] == "ok"
    est = res.estimates["estimate"].to_numpy().reshape(2, -1)
    np.testing.assert_array_equal(est != 0, pooled_support(X, Y))
    sp = res.summary["sparsity"]
    assert sp["refits"] >= 2 and "pruned_at" not in sp and "every" not in sp


def test_scaffold_with_whitening_checks_the_rank_on_the_kept_terms(fleet):
    # the restricted Gram matrices have rank 6 (the kept terms), not 40: not a reason to
    # refuse data whose Gram matrices have full rank
    file, X, Y = fleet
    res = run(file, strategy="scaffold", sparsity="stlsq", R=3, lr=0.05)
    est = res.estimates["estimate"].to_numpy().reshape(2, -1)
    np.testing.assert_array_equal(est != 0, pooled_support(X, Y))


def test_whitened_fedavg_fits_the_mean_of_the_own_fits_on_the_pooled_support(tmp_path):
    # a fleet whose mean of the clients' own fits keeps a spurious term that pooled least
    # squares drops: the support is the pooled one, the values FedAvg's own fixed point
    # (with whitened steps, the mean of the clients' own least squares on the kept terms)
    file, X, Y = duffing_fleet(tmp_path, M=10, N=2, T=40, noise=0.5, seed=3)
    clients = own_samples(file)
    keep = pooled_support(X, Y)
    mean_own = np.zeros((2, 20))
    for Xi, Yi in clients:
        for j in range(2):
            mean_own[j] += np.linalg.lstsq(Xi, Yi[:, j], rcond=None)[0] / len(clients)
    _, mean_keep, _ = stlsq(np.eye(40), mean_own.reshape(-1), 0.01)     # thresholding the mean
    assert (mean_keep.reshape(2, -1) != keep).any()       # the old rule chose other terms here
    # the threshold in the data's units, as the reference thresholds (pooled_support)
    res = run(file, "sparsity.scale=data", "sparsity.threshold=0.01", strategy="fedavg",
              sparsity="stlsq", R=200)
    est = res.estimates["estimate"].to_numpy().reshape(2, -1)
    np.testing.assert_array_equal(est != 0, keep)
    ref = np.zeros((2, 20))
    for Xi, Yi in clients:
        for j in range(2):
            ref[j, keep[j]] += np.linalg.lstsq(Xi[:, keep[j]], Yi[:, j],
                                               rcond=None)[0] / len(clients)
    np.testing.assert_allclose(est, ref, rtol=0, atol=1e-9)


def own_samples(file):
    """Each client's training samples (Phi of the degree-3 library, Y), in the file's order."""
    df = pd.read_csv(file)
    lib, out = Polynomial(degree=3), []
    for _, rows in df[df["split"] == "train"].groupby("client", sort=False):
        X, Y = [], []
        for _, tr in rows.groupby("trajectory", sort=False):
            x, u = tr[["x1", "x2"]].to_numpy(), tr[["u"]].to_numpy()
            X.append(lib.transform(x[:-1], u[:-1]))
            Y.append(x[1:])
        out.append((np.concatenate(X), np.concatenate(Y)))
    return out


def test_oneshot_stlsq_averages_the_own_fits_on_the_pooled_support(fleet):
    file, X, Y = fleet
    res = run(file, strategy="oneshot", sparsity="stlsq")
    assert res.summary["status"] == "ok" and kept(res) == TRUE
    # the reference: pooled STLSQ chooses the terms, each client fits its own least squares
    # on them, the server averages
    keep = pooled_support(X, Y)
    clients = own_samples(file)
    coef = np.zeros((2, 20))
    for Xc, Yc in clients:
        for j in range(2):
            coef[j, keep[j]] += np.linalg.lstsq(Xc[:, keep[j]], Yc[:, j],
                                                rcond=None)[0] / len(clients)
    np.testing.assert_allclose(res.estimates["estimate"].to_numpy(), coef.reshape(-1),
                               rtol=0, atol=1e-10)
    assert res.summary["sparsity"]["terms"] == 6 and res.summary["sparsity"]["refits"] >= 2


def lines(caplog) -> list[str]:
    out = [r.getMessage() for r in caplog.records if "model check" in r.getMessage()]
    caplog.clear()
    return out


@pytest.mark.slow
def test_model_check_passes_the_cubic_library_and_flags_the_linear_one(fleet, caplog):
    file, _, _ = fleet
    caplog.set_level("WARNING", logger="fnsysid")
    good = run(file, strategy="centralized_exact", sparsity="stlsq").summary["model_check"]
    assert good["ok"] is True and good["verdict"] == "ok" and good["white"] is True
    assert good["free_run_ok"] is True and good["test"] == "billings-voon"
    # x2+ tested (x1+ = x1 + dt x2 exact in all 8 clients): phi_ee at lags 1..10, and
    # phi_ze, phi_z2e, phi_z2e2 at lags 0..10 and phi_e(ez) at lags 1..11 of z = x1, x2, u
    assert good["tests"] == 10 + 3 * 4 * 11 and good["exact"] == 8
    # the clients' alpha and beta differ by up to 20 %: said of the intervals alone
    said = lines(caplog)
    assert good["overfit"] == [] and len(said) == 1 and said[0].startswith(
        "the intervals of estimates.csv (pooled least squares refitted on the kept terms) "
        "treat the clients as one system")
    # all 40 terms from 360 samples a client: their estimation error is expected to add 2-22 %
    # to the held-out error, so c4's held-out error of 1.64 times its training noise (1.10
    # expected) is not "too many terms"; c3's held-out transitions that go beyond twice its
    # training range (half of them) are left out of its tests
    full = run(file, strategy="centralized_exact").summary["model_check"]
    assert full["ok"] is True and full["white"] is True and full["verdict"] == "ok"
    assert full["overfit"] == [] and full["extrapolating"] == [[0, "c3"]]
    assert full["extrapolating_worst"]["client"] == "c3"
    assert full["extrapolating_worst"]["share"] == pytest.approx(0.5)
    assert full["extrapolating_untested"] == [0]
    assert not [x for x in lines(caplog) if "too many terms" in x]
    # the same 40 terms from 2 x 30 samples a client: every client's fit is expected to
    # predict its held-out data 5 to 236 times worse than its noise, and does; named apart
    # (too many terms), not taken for a wrong model class
    (file.parent / "few").mkdir(exist_ok=True)
    few, _, _ = duffing_fleet(file.parent / "few", N=2, T=30)
    loose = run(few, strategy="centralized_exact").summary["model_check"]
    assert loose["ok"] is True and loose["verdict"] == "overfit" and len(loose["overfit"]) == 8
    assert all(d["expected"] > 1.5 and d["ratio"] > 1.5 for d in loose["overfit_detail"])
    said = [x for x in lines(caplog) if "too many terms" in x]
    assert len(said) == 1 and "too many terms for their data, not a missing term" in said[0]
    assert "expected from its estimation error" in said[0]
    assert said[0].endswith("fewer terms (sparsity=stlsq, a smaller library) or more data per "
                            "client")
    bad = run(file, strategy="centralized_exact", degree=1).summary["model_check"]
    assert bad["ok"] is False and bad["white"] is False and bad["free_run_ok"] is False
    assert bad["verdict"] == "free run fails"
    assert bad["worst"]["target"] == "x2+" and bad["p_adjusted"] < 0.01
    # every client's free run is worse than all 19 noisy runs of its own fit
    assert bad["free_run_exceed"] == bad["free_run_clients"] == [8]
    wrong = [x for x in lines(caplog) if "model class looks wrong" in x]
    assert len(wrong) == 1 and "try a richer library" in wrong[0]


def test_a_noiseless_process_is_not_flagged(tmp_path):
    file, _, _ = duffing_fleet(tmp_path, M=4, noise=0.0)
    check = run(file, strategy="centralized_exact", sparsity="stlsq").summary["model_check"]
    assert check["ok"] is True and check["tests"] == 0 and check["exact"] == 8


def test_a_noiseless_process_with_a_missing_term_is_a_wrong_class_not_overfit(tmp_path):
    # without noise the training residuals of the linear library are its misfit alone, and
    # the held-out states differ: the held-out error is far above the training "noise" (up
    # to 10^4 times) though 8 terms from 5 x 59 samples cannot overfit
    file, _, _ = duffing_fleet(tmp_path, M=5, noise=0.0)
    check = run(file, strategy="centralized_exact", degree=1).summary["model_check"]
    assert check["ok"] is False and check["white"] is False
    assert check["verdict"] in ("missing terms", "free run fails")
    assert check["worst"]["target"] == "x2+" and check["exact"] == 5     # x1+ is exact


def mc(verdict, support, overfit=()):
    return {"ok": verdict in ("ok", "overfit"), "verdict": verdict,
            "white": verdict != "missing terms",
            "free_run_ok": True, "overfit": list(overfit), "overfit_limit": 1.5,
            "overfit_detail": [{"repeat": 0, "client": "c1", "ratio": 30.0, "expected": 24.0,
                                "direction_share": 0.9, "condition": 8e5}],
            "support": support, "tests": 4, "rejected": 1, "p_min": 1e-9,
            "p_adjusted": 4e-9, "level": 0.01, "excess_rejected": [],
            "worst": {"target": "x2+", "client": "c0", "repeat": 0, "test": "phi_ee",
                      "lag": 1, "Z": 6.0, "correlation": 0.5}}


def test_model_check_advice_follows_the_sparsity_setting():
    from fnsysid.results.modelcheck import verdict

    dense = verdict(mc("overfit", "all terms", [[0, "c1"]]))
    assert "worst: client c1 in repeat 0, held-out error 30 times its training noise (24 " \
        "expected from its estimation error), 90% of its expected excess on one direction, " \
        "Gram condition 8e+05" in dense
    assert dense.endswith("try fewer terms (sparsity=stlsq, a smaller library) or more data "
                          "per client")
    sparse = verdict(mc("overfit", "sparsity", [[0, "c1"]]))
    assert "sparsity=stlsq" not in sparse
    assert sparse.endswith("try a larger sparsity.threshold (fewer terms) or more data per "
                           "client")
    assert verdict(mc("missing terms", "all terms")).endswith(
        "try a richer library (feature_map.degree, another feature_map or one of your own)")
    assert "try a smaller sparsity.threshold (the check fits the kept terms) or a richer " \
        "library" in verdict(mc("missing terms", "sparsity"))
    assert verdict(mc("ok", "all terms")) is None
    # with finetune models sparsity is refused: the advice does not offer it as a step
    personal = verdict(mc("overfit", "all terms", [[0, "c1"]]), personalized=True)
    assert personal.endswith("try a smaller library (feature_map.degree, fewer features) or "
                             "more data per client (sparsity=stlsq prunes terms with "
                             "personalize=none or auto)")


def test_a_threshold_that_prunes_every_term_of_a_state_says_so(fleet, caplog):
    file, _, _ = fleet
    caplog.set_level("WARNING", logger="fnsysid")
    # thresholds in the data's units: 0.5 keeps x1+:x1 and x2+:x2 only (with scale=unit,
    # x1+:x2 = dt carries all of x1's increment, its scaled coefficient is 1)
    res = run(file, strategy="centralized_exact", sparsity="stlsq",
              **{"sparsity.threshold": 0.5, "sparsity.scale": "data"})
    sp = res.summary["sparsity"]
    assert sp["support_size"] == {"x1+": 1, "x2+": 1} and "empty" not in sp
    assert not [r for r in caplog.records if "pruned every term" in r.getMessage()]
    caplog.clear()
    res = run(file, strategy="centralized_exact", sparsity="stlsq",
              **{"sparsity.threshold": 100, "sparsity.scale": "data"})
    sp = res.summary["sparsity"]
    assert sp["terms"] == 0 and sp["empty"] == {"x1+": [0], "x2+": [0]}
    assert (res.estimates["estimate"] == 0).all()
    said = [r.getMessage() for r in caplog.records if "pruned every term" in r.getMessage()]
    assert said == ["sparsity: sparsity.threshold=100 pruned every term of x1+; x2+: the model "
                    "has no term for these states (its part of the regression is 0); a smaller "
                    "sparsity.threshold keeps terms"]
    wrong = [r.getMessage() for r in caplog.records if "model class looks wrong" in
             r.getMessage()]
    assert len(wrong) == 1 and "try a smaller sparsity.threshold" in wrong[0]


def test_summary_counts_the_kept_terms_of_each_repeat():
    res = fnsysid.run(["system=synthetic", "strategy=oneshot", "M=10", "sparsity=stlsq",
                       "sparsity.threshold=0.15", "sparsity.scale=data", "output.plot=false",
                       "progress=false"])
    sp, est = res.summary["sparsity"], res.estimates
    per_repeat = [int(v) for v in (est["estimate"] != 0).groupby(est["repeat"]).sum()]
    assert len(set(per_repeat)) > 1 and sp["terms"] == per_repeat     # not their maximum
    sizes = sp["support_size"]
    assert [sum(v) for v in zip(*sizes.values(), strict=True)] == per_repeat


@pytest.mark.parametrize("extra, words", [
    (["strategy=local"], "sparsity=stlsq with strategy=local: every client keeps its own model"),
    (["sparsity.threshold=0"], "sparsity.threshold=0 is not allowed: sparsity.threshold must "
                               "be a finite number > 0"),
    (["optimizer.scale_features=zscore"], "sparsity=stlsq with optimizer.scale_features=zscore"),
    (["personalize=finetune"], "sparsity=stlsq with personalize=finetune: its local steps "
                               "would fit every term"),
    (["sparsity.scale=raw"], "sparsity.scale"),
])
def test_settings_that_cannot_prune_are_refused_in_one_line(extra, words):
    with pytest.raises(fnsysid.ConfigError) as err:
        fnsysid.run(["system=synthetic", "sparsity=stlsq", *extra])
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("strategy", ["centralized_exact", "oneshot"])
def test_closed_form_strategies_take_no_local_steps_and_accept_zscore(fleet, strategy):
    file, _, _ = fleet
    z = run(file, strategy=strategy, sparsity="stlsq", **{"optimizer.scale_features": "zscore"})
    plain = run(file, strategy=strategy, sparsity="stlsq")
    assert kept(z) == TRUE and z.summary["status"] == "ok"
    np.testing.assert_array_equal(z.estimates["estimate"], plain.estimates["estimate"])


def test_sgd_keeps_pruned_terms_at_zero(fleet):
    file, _, _ = fleet
    sgd = run(file, "optimizer=sgd", "optimizer.batch_size=60", strategy="fedavg",
              sparsity="stlsq", R=30, lr=0.05)
    est = sgd.estimates
    assert kept(sgd) <= set(est["parameter"]) and len(kept(sgd)) < 40
    assert sgd.summary["sparsity"]["terms"] == len(kept(sgd)) and sgd.summary["status"] == "ok"


@pytest.mark.slow
@pytest.mark.flower
@pytest.mark.parametrize("strategy", ["fedavg", "scaffold"])
def test_flower_runtime_sends_the_support_and_matches_inprocess(strategy):
    from fnsysid.runtimes import check as runtime

    if not runtime.flower_installed():
        pytest.skip("Flower is not installed (extra: pip install -e '.[flower]')")
    args = ["system=linear", "M=4", "R=6", "repeats=2", "eps=0.3", "N=[3,5,2,4]",
            "feature_map=polynomial", "sparsity=stlsq", "sparsity.threshold=0.05",
            f"strategy={strategy}", "output.plot=false"]
    a = fnsysid.run(args)
    b = fnsysid.run([*args, "runtime=flower"])
    assert a.summary["sparsity"]["refits"] == b.summary["sparsity"]["refits"] >= 2
    assert a.summary["sparsity"]["support_size"] == b.summary["sparsity"]["support_size"]
    np.testing.assert_allclose(b.errors["e_max"], a.errors["e_max"], rtol=0, atol=1e-10)
    np.testing.assert_allclose(b.estimates["estimate"], a.estimates["estimate"], rtol=0,
                               atol=1e-10)
    assert ((b.estimates["estimate"] == 0) == (a.estimates["estimate"] == 0)).all()


# --- scale-free thresholds, unbias ------------------------------------------------------------

#: a pendulum x+ = (theta + dt omega, omega + dt (-g/l sin theta + torque)), g/l = 9.81 / 0.5
PEND_GL = 9.81 / 0.5
PEND_TRUE = {"theta+:theta", "theta+:omega", "omega+:omega", "omega+:torque",
             "omega+:sin(theta)"}


def pendulum_fleet(path, dt=0.01, M=5, N=4, T=200, noise=1e-4, seed=0, spread=0.0, x0=2.0):
    """M files (one per client) of N runs of T samples each, columns ``run, timestamp, theta,
    omega, torque`` (forward Euler from uniform states in ``[-x0, x0]``, velocity disturbance
    ``noise``; client c's gravity term times ``1 + spread (c + 1)``); returns the folder and
    the pooled samples (Phi of identity + sine: theta, omega, torque, sin of each; Y)."""
    rng = np.random.default_rng(seed)
    path.mkdir(parents=True, exist_ok=True)
    X, Y = [], []
    for c in range(M):
        rows = []
        for j in range(N):
            x = np.empty((T, 2))
            x[0] = rng.uniform(-x0, x0, 2)
            u = rng.normal(size=T)
            for t in range(T - 1):
                th, om = x[t]
                x[t + 1] = (th + dt * om,
                            om + dt * (-PEND_GL * (1 + spread * (c + 1)) * np.sin(th) + u[t])
                            + noise * rng.normal())
            rows.append(pd.DataFrame({"run": j, "timestamp": np.arange(T) * dt,
                                      "theta": x[:, 0], "omega": x[:, 1], "torque": u}))
            z = np.column_stack([x[:-1], u[:-1]])
            X.append(np.column_stack([z, np.sin(z)]))
            Y.append(x[1:])
        pd.concat(rows).to_csv(path / f"c{c}.csv", index=False)
    return path, np.concatenate(X), np.concatenate(Y)


def run_pendulum(folder, *extra):
    return fnsysid.run(["system=generic", "data=files", f"data.path={folder}",
                        "data.states=[theta,omega]", "data.inputs=[torque]", "data.trajectory=run",
                        "data.time=timestamp", "feature_map=combined", "sparsity=stlsq",
                        "output.plot=false", "progress=false", *extra])


@pytest.mark.slow
def test_pendulum_at_100_hz_keeps_the_five_true_terms_at_the_default_threshold(tmp_path):
    folder, _, _ = pendulum_fleet(tmp_path / "pendulum")
    for strategy in ("fedavg", "centralized_exact"):
        res = run_pendulum(folder, f"strategy={strategy}")
        assert kept(res) == PEND_TRUE and res.summary["status"] == "ok"
        est = res.estimates.set_index("parameter")["estimate"]
        assert abs(est["theta+:omega"] - 0.01) < 1e-6
        assert abs(est["omega+:sin(theta)"] + 0.01 * PEND_GL) < 1e-3
        assert res.summary["sparsity"]["scale"] == "unit"
        assert "below_threshold" not in res.summary["sparsity"]
    # the same threshold in the data's units cuts theta+:omega = dt (|0.01| ~ 0.01) and the
    # torque (dt): the default before the scaled threshold
    data = run_pendulum(folder, "strategy=centralized_exact", "sparsity.scale=data")
    assert "theta+:omega" not in kept(data) and kept(data) < PEND_TRUE


@pytest.mark.slow
def test_a_kept_term_the_strategys_model_drives_below_the_threshold_is_reported(tmp_path,
                                                                                caplog):
    # noise-free pendulums whose gravity terms are 1 % apart (docs/guide/sparsity.md): the
    # pooled fit leans on theta in omega+ (kept), the mean of the clients' own fits, which
    # whitened FedAvg reaches, has none (round-off)
    folder, _, _ = pendulum_fleet(tmp_path / "het", M=5, N=10, T=100, noise=0.0, spread=0.01,
                                  x0=0.5)
    caplog.set_level("WARNING", logger="fnsysid")
    res = run_pendulum(folder, "strategy=fedavg")
    (faded,) = res.summary["sparsity"]["below_threshold"]
    assert faded["parameter"] == "omega+:theta" and faded["repeats"] == [0]
    assert abs(faded["estimate"]) < 1e-9 and "omega+:theta" in kept(res)
    # the threshold applies to the coefficient scaled to unit size: the line shows both
    assert abs(faded["scaled"]) < 0.05 and faded["scaled"] != faded["estimate"]
    said = [r.getMessage() for r in caplog.records if "name only" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(
        "sparsity: 1 kept term is below sparsity.threshold=0.05, which applies to "
        "coefficients of features and targets scaled to unit size, in the final model "
        f"(omega+:theta {faded['estimate']:.4g} (scaled {faded['scaled']:.3g}))"
    ) and "strategy=fedavg's model does not equal" in said[0]
    assert res.summary["status"] == "ok"
    # the pooled model itself: its coefficient is the one the term was kept for
    pooled = run_pendulum(folder, "strategy=centralized_exact")
    assert "below_threshold" not in pooled.summary["sparsity"]
    assert abs(pooled.estimates.set_index("parameter")["estimate"]["omega+:theta"]) > 1e-3


def test_faded_compares_each_repeats_threshold_on_the_choices_scale():
    from fnsysid.learning.sparsity import STLSQ

    sp = STLSQ(threshold=0.1, scale="data")
    H, b = np.eye(3)[None].repeat(2, axis=0), np.array([[1.0, 0.5, 0.2], [1.0, 0.5, 0.05]])
    sp.choose(H, b, np.ones((2, 1)), model=None)
    np.testing.assert_array_equal(sp.support, [[1, 1, 1], [1, 1, 0]])
    theta = np.array([[1.0, 0.05, 0.2], [1.0, 0.09, 0.0]])
    np.testing.assert_array_equal(sp.faded(theta), [[0, 1, 0], [0, 1, 0]])
    sp.auto, sp.chosen = True, np.array([0.01, 0.1])       # per repeat, as auto chooses
    np.testing.assert_array_equal(sp.faded(theta), [[0, 0, 0], [0, 1, 0]])


def test_unit_scales_are_the_regressor_rms_over_the_target_beyond_its_largest_term(tmp_path):
    from fnsysid.learning.sparsity import unit_scales

    ratios = []
    for dt in (0.01, 0.001):
        _, X, Y = pendulum_fleet(tmp_path / f"p{dt}", dt=dt, M=2, N=2)
        theta = np.linalg.lstsq(X, Y, rcond=None)[0].T                    # (2, 6)
        enters = np.kron(np.eye(2), np.ones(6)).astype(bool)              # (2, 12)
        w = unit_scales(theta.reshape(-1), np.tile((X ** 2).sum(0), 2),
                        (X.T @ Y).T.reshape(-1), (Y ** 2).sum(0), enters, np.ones(12, bool))
        # the reference from the samples: the RMS of each target once its largest term
        # (the one leaving the least) is taken away
        rest = [min(np.sum((Y[:, j] - theta[j, k] * X[:, k]) ** 2) for k in range(6))
                for j in range(2)]
        ref = np.sqrt((X ** 2).sum(0)[None, :] / np.array(rest)[:, None])  # (2, 6)
        np.testing.assert_allclose(w.reshape(2, 6), ref, rtol=1e-9)
        ratios.append(np.abs(theta * ref))
    # theta+:omega (= dt) carries all of theta's increment: scaled coefficient ~1 at either
    # sample time; the torque's share of omega's increment does not depend on dt either
    assert abs(ratios[0][0, 1] - 1) < 0.01 and abs(ratios[1][0, 1] - 1) < 0.01
    np.testing.assert_allclose(ratios[0][1, 2], ratios[1][1, 2], rtol=0.2)
    assert ratios[1][1, 2] > 0.05


def offset_tanks(path, offset, M=20, runs=5, T=200, noise=0.01, leak=0.02, seed=0,
                 intercept=True, moving=0.0, spacing=0.0):
    """Tanks ``x+ = offset + (1 - leak) (x - offset) + leak u + noise w`` (an operating point
    ``offset``), the last of each client's runs held out; one CSV; with the samples of the
    training runs, ``[1, x, u]`` and ``x+``. ``intercept=False``: ``x+ = (1 - leak) x +
    leak u + noise w`` with the inputs about ``offset`` (no constant term, the states about
    ``offset`` too). ``moving`` > 0: two more states ``x2``, ``x3``, a damped oscillator
    driven by ``u`` about 0, ``moving`` times the size of the tank's spread or more.
    ``spacing``: client i's operating point is ``offset + spacing i``."""
    rng = np.random.default_rng(seed)
    offset = offset + spacing * np.arange(M)[:, None]                      # (M, 1)
    x = np.empty((M, runs, T + 1))
    x[..., 0] = offset + rng.normal(size=(M, runs))
    u = rng.normal(size=(M, runs, T + 1)) + (0.0 if intercept else offset[..., None])
    w = rng.normal(size=(M, runs, T))
    z = np.zeros((M, runs, T + 1, 2))
    z[..., 0, :] = rng.normal(size=(M, runs, 2))
    A = np.array([[0.99, 0.1], [-0.1, 0.98]])
    for t in range(T):
        x[..., t + 1] = (offset if intercept else 0.0) + (1 - leak) * (
            x[..., t] - (offset if intercept else 0.0)) + leak * u[..., t] + noise * w[..., t]
        z[..., t + 1, :] = z[..., t, :] @ A.T + np.stack(
            [np.zeros_like(u[..., t]), 0.05 * (u[..., t] - (0.0 if intercept else offset))],
            axis=-1) + noise * rng.normal(size=(M, runs, 2))
    c, j, t = np.meshgrid(np.arange(M), np.arange(runs), np.arange(T + 1), indexing="ij")
    file = path / f"tank{offset[0, 0]:g}{'' if intercept else 'n'}{moving:g}-{spacing:g}.csv"
    table = {"client": [f"c{i}" for i in c.ravel()], "trajectory": j.ravel(), "t": t.ravel(),
             "split": np.where(j.ravel() == runs - 1, "val", "train"), "x1": x.ravel(),
             "u": u.ravel()}
    if moving:
        table.update(x2=moving * z[..., 0].ravel(), x3=moving * z[..., 1].ravel())
    pd.DataFrame(table).to_csv(file, index=False)
    xs, us = x[:, :-1, :-1].reshape(-1), u[:, :-1, :-1].reshape(-1)
    X = np.stack([np.ones_like(xs), xs, us], axis=1)
    return file, X, x[:, :-1, 1:].reshape(-1)


@pytest.mark.slow
def test_an_operating_point_far_from_0_does_not_prune_a_true_term(tmp_path):
    """The unit scales are taken about the means where the library has the constant: the
    same scaled coefficients of ``x`` and ``u`` with the states about 0 or about 300. Measured
    against the raw sums, the offset sat in what the target does besides its largest term
    (``0.02 x`` = 6 against an increment of RMS 0.02), and the input's 0.02 scaled to 0.0033,
    below the default 0.05: pruned, and the model check then said terms look missing."""
    from fnsysid.learning.sparsity import unit_scales

    scaled = {}
    for offset in (0.0, 300.0):
        file, X, y = offset_tanks(tmp_path, offset)
        theta = np.linalg.lstsq(X, y, rcond=None)[0]
        H, b = X.T @ X, X.T @ y
        args = (theta, np.diag(H), b, np.array([y @ y]), np.ones((1, 3), bool),
                np.ones(3, bool))
        centre = (H[0], np.full(3, b[0]), np.full(3, H[0, 0]), np.array([True, False, False]))
        scaled[offset] = np.abs(theta * unit_scales(*args, centre))
        if offset:
            raw = np.abs(theta * unit_scales(*args))
            assert raw[2] < 0.005 < 0.05 < scaled[offset][2]        # u: the old drop
        res = engine("system=generic", "data=files", f"data.path={file}", "data.states=[x1]",
                     "data.inputs=[u]", "feature_map=affine", "strategy=centralized_exact",
                     "sparsity=stlsq", "output.plot=false", "progress=false")
        want = {"x1+:x1", "x1+:u"} | ({"x1+:1"} if offset else set())
        assert kept(res) == want, offset
        assert res.summary["model_check"]["verdict"] == "ok"
    np.testing.assert_allclose(scaled[300.0][1:], scaled[0.0][1:], rtol=1e-6)
    assert scaled[0.0][2] > 0.5                        # the input carries most of the increment
    # a model without a constant, its inputs and states about 300: the constant is weighed
    # against the target's rest with its mean, so its estimate (noise extrapolated to 0, -0.1
    # on another fleet of this kind) is pruned; weighed about the mean it was kept
    for seed in (0, 1):
        file, _, _ = offset_tanks(tmp_path, 300.0, intercept=False, seed=seed)
        res = engine("system=generic", "data=files", f"data.path={file}", "data.states=[x1]",
                     "data.inputs=[u]", "feature_map=affine", "strategy=centralized_exact",
                     "sparsity=stlsq", "output.plot=false", "progress=false")
        assert kept(res) == {"x1+:x1", "x1+:u"}, seed


def test_ridge_with_unbias_equals_pysindy_default(fleet):
    ps = pytest.importorskip("pysindy", reason="the comparison needs the [compare] extra "
                             "(pip install -e '.[compare]')")
    file, X, Y = fleet
    H, b = np.kron(np.eye(2), X.T @ X), (X.T @ Y).T.reshape(-1)
    for unbias in (True, False):
        ref = ps.STLSQ(threshold=0.01, alpha=50.0, unbias=unbias).fit(X, Y).coef_
        coef, support, _ = stlsq(H, b, threshold=0.01, alpha=50.0, unbias=unbias)
        assert ((ref != 0) == support.reshape(2, -1)).all()
        np.testing.assert_allclose(coef.reshape(2, -1), ref, rtol=0, atol=1e-8)
    # through a run: centralized_exact pools the statistics, the ridge shares add up to alpha
    ref = ps.STLSQ(threshold=0.01, alpha=50.0).fit(X, Y).coef_
    res = run(file, strategy="centralized_exact", sparsity="stlsq",
              **{"sparsity.alpha": 50.0, "sparsity.scale": "data"})
    np.testing.assert_allclose(res.estimates["estimate"].to_numpy(), ref.reshape(-1), rtol=0,
                               atol=1e-8)
    assert res.summary["sparsity"]["unbias"] is True


def test_unbias_changes_only_the_values_of_the_kept_terms(fleet):
    file, _, _ = fleet
    kw = {"sparsity.alpha": 200.0, "sparsity.scale": "data"}
    a = run(file, strategy="centralized_exact", sparsity="stlsq", **kw)
    b = run(file, strategy="centralized_exact", sparsity="stlsq", **kw,
            **{"sparsity.unbias": False})
    assert kept(a) == kept(b)
    assert not np.allclose(a.estimates["estimate"], b.estimates["estimate"], rtol=0, atol=1e-6)


@pytest.mark.parametrize("strategy", ["fedlin", "scaffold"])
def test_fedlin_and_scaffold_whose_rounds_diverge_are_refused_before_the_run(tmp_path,
                                                                               strategy):
    # a generic degree-3 fit at the defaults (whitened steps, lr 0.5, K 5): the correction
    # goes through each client's own inverse Gram matrix and the round's map has a spectral
    # radius far above 1 in every repeat
    file, _, _ = duffing_fleet(tmp_path, M=10, N=2, T=40, noise=0.5, seed=3)
    with pytest.raises(fnsysid.ConfigError) as err:
        run(file, strategy=strategy)
    msg = str(err.value)
    assert msg.startswith(f"strategy={strategy} with optimizer.scale_features=whiten, lr=0.5, "
                          "K=5: a round multiplies the distance to its fixed point by ")
    assert "allowed: strategy=fedavg, fedprox or fednova" in msg and "\n" not in msg
    # the same rounds step by step (no precomputed map, so no check): they do diverge
    res = run(file, "optimizer.affine=false", strategy=strategy, R=30)
    assert res.summary["status"] == "diverged"


@pytest.mark.slow
def test_the_default_threshold_finds_the_duffing_terms_with_noise(tmp_path):
    """The scale-free default (0.05 of what a target does besides its largest term) keeps the
    six true Duffing terms on a noisy fleet; 0.01 on the same scale keeps spurious ones (why
    the default is not 0.01)."""
    file, _, _ = duffing_fleet(tmp_path, M=20, N=2, T=50, noise=0.5, seed=2)
    res = run(file, strategy="centralized_exact", sparsity="stlsq")
    assert res.summary["sparsity"]["threshold"] == 0.05 and kept(res) == TRUE
    loose = run(file, "sparsity.threshold=0.01", strategy="centralized_exact", sparsity="stlsq")
    assert kept(loose) > TRUE
