"""sparsity.threshold=auto: the threshold chosen along a path of STLSQ supports by the held-out
error of each candidate's pooled fit (BIC on the training data without held-out data),
checked against a direct computation from the samples."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import fnsysid
from fnsysid.config.errors import ConfigError
from fnsysid.dynamics.features import Polynomial
from fnsysid.learning.sparsity import AUTO_GRID
from tests.test_sparsity import PEND_TRUE, duffing_fleet, kept, pendulum_fleet, run, run_pendulum


def samples(file, split):
    """Pooled samples (Phi of the degree-3 library, Y) of the rows ``split`` of ``file``."""
    df = pd.read_csv(file)
    lib = Polynomial(degree=3)
    X, Y = [], []
    for _, g in df[df["split"] == split].groupby(["client", "trajectory"], sort=False):
        x, u = g[["x1", "x2"]].to_numpy(), g[["u"]].to_numpy()
        X.append(lib.transform(x[:-1], u[:-1]))
        Y.append(x[1:])
    return np.concatenate(X), np.concatenate(Y)


def stlsq_unit(X, y, t):
    """STLSQ of one target on the samples, the coefficients compared after scaling by the
    spread of their feature over the spread of what the target does besides its largest
    term (both about their means: the library has an intercept); the constant feature
    (column 0) by its RMS over that rest's RMS with its mean."""
    assert (X[:, 0] == 1).all()
    keep = np.ones(X.shape[1], bool)
    size = ((X - X.mean(0)) ** 2).sum(0)
    size[0] = len(X)
    for _ in range(20):
        coef = np.zeros(X.shape[1])
        coef[keep] = np.linalg.lstsq(X[:, keep], y, rcond=None)[0]
        rests = [y - coef[k] * X[:, k] for k in np.flatnonzero(keep)]
        rest = np.full(X.shape[1], min(np.sum((r - r.mean()) ** 2) for r in rests))
        rest[0] = min(np.sum(r ** 2) for r in rests)
        new = keep & (np.abs(coef) * np.sqrt(size / rest) >= t)
        if (new == keep).all():
            break
        keep = new
    return coef, keep


def direct_rule(X, Y, Xv=None, Yv=None, margin=0.0):
    """The rule from the samples: per grid threshold the support and pooled fit of each
    target; the score ``sum_j n log(RSS_j / n)`` on the held-out samples, or on the training
    samples plus ``log(n)`` per kept term (BIC), ``RSS_j`` at least ``1e-12`` of the target's
    sum of squares (``x1+ = x1 + dt x2`` has no noise: its residuals are round-off); among
    the scores within ``margin`` of the smallest the fewest terms, then the smallest score;
    the threshold reported is the middle of the grid's thresholds with that support."""
    supports, scores = [], []
    for t in AUTO_GRID:
        fits = [stlsq_unit(X, Y[:, j], t) for j in range(Y.shape[1])]
        keep = np.concatenate([f[1] for f in fits])
        if Xv is None:
            n = len(X)
            rss = [max(np.sum((Y[:, j] - X @ f[0]) ** 2), 1e-12 * np.sum(Y[:, j] ** 2))
                   for j, f in enumerate(fits)]
            score = sum(n * np.log(r / n) for r in rss) + keep.sum() * np.log(n)
        else:
            n = len(Xv)
            rss = [max(np.sum((Yv[:, j] - Xv @ f[0]) ** 2), 1e-12 * np.sum(Yv[:, j] ** 2))
                   for j, f in enumerate(fits)]
            score = sum(n * np.log(r / n) for r in rss)
        supports.append(keep)
        scores.append(score)
    scores, terms = np.array(scores), np.array([s.sum() for s in supports])
    near = scores <= scores.min() + margin
    best = min(range(len(AUTO_GRID)), key=lambda i: (not near[i], terms[i], scores[i], -i))
    same = [i for i, s in enumerate(supports) if (s == supports[best]).all()]
    return supports[best], AUTO_GRID[same[(len(same) - 1) // 2]], terms, scores


@pytest.mark.parametrize("val, margin", [(1, 0.0), (0, 0.0), (1, 2.0), (0, 2.0)])
def test_auto_equals_a_direct_computation_of_the_rule(tmp_path, val, margin):
    # a small noisy fleet: the smallest thresholds keep spurious terms, so the choice matters
    file, X, Y = duffing_fleet(tmp_path, M=3, N=2, T=40, val=val, noise=2.0, seed=3)
    res = run(file, strategy="centralized_exact", sparsity="stlsq",
              **{"sparsity.threshold": "auto", "sparsity.margin": margin})
    Xv, Yv = samples(file, "val") if val else (None, None)
    support, threshold, terms, scores = direct_rule(X, Y, Xv, Yv, margin)
    sp = res.summary["sparsity"]
    assert sp["rule"] == ("heldout" if val else "bic") and sp["auto"] is True
    assert kept(res) == set(res.estimates["parameter"].to_numpy()[support])
    assert sp["threshold"] == pytest.approx(threshold, rel=1e-12)
    path = pd.DataFrame(sp["path"])
    # at the last threshold, 1, the scaled coefficient of x1+:x2 is 1 exactly (x1+ = x1 +
    # dt x2 has no noise: that term is all of its increment), so round-off decides there
    assert AUTO_GRID[-1] == 1.0
    np.testing.assert_array_equal(path["n_terms"][:-1], terms[:-1])
    np.testing.assert_allclose(path["score"][:-1], scores[:-1], rtol=1e-9)
    assert abs(path["n_terms"].iat[-1] - terms[-1]) <= 1
    assert len(set(terms)) > 3                       # the path runs through several supports
    # the kept coefficients are the pooled least squares on the support
    est = res.estimates["estimate"].to_numpy().reshape(2, -1)
    for j in range(2):
        ref = np.linalg.lstsq(X[:, support[j * 20:(j + 1) * 20]], Y[:, j], rcond=None)[0]
        np.testing.assert_allclose(est[j][support[j * 20:(j + 1) * 20]], ref, rtol=1e-8)


@pytest.mark.slow
def test_auto_writes_the_path_and_logs_the_fallback(tmp_path, caplog):
    file, _, _ = duffing_fleet(tmp_path, M=2, N=2, T=40, val=0, noise=0.5, seed=2)
    out = tmp_path / "run"
    with caplog.at_level("WARNING"):
        res = fnsysid.run(["system=generic", "data=files", f"data.path={file}",
                           "data.states=[x1,x2]", "data.inputs=[u]", "feature_map=polynomial",
                           "feature_map.degree=3", "strategy=centralized_exact",
                           "sparsity=stlsq", "sparsity.threshold=auto", "output.plot=false",
                           "progress=false"], output_dir=out)
    table = pd.read_csv(out / "sparsity_path.csv")
    assert list(table.columns) == ["repeat", "threshold", "n_terms", "score", "chosen", "rule"]
    np.testing.assert_allclose(table["threshold"], AUTO_GRID, rtol=1e-12)
    assert (table["rule"] == "bic").all() and table["chosen"].sum() == 1
    assert table.loc[table["chosen"], "threshold"].item() == pytest.approx(
        res.summary["sparsity"]["threshold"])
    assert table.loc[table["chosen"], "n_terms"].item() == res.summary["sparsity"]["terms"]
    assert any("by BIC" in r.getMessage() and "no held-out data" in r.getMessage()
               and "the fewest terms within sparsity.margin=2 of the best score"
               in r.getMessage() for r in caplog.records)
    assert res.summary["sparsity"]["margin"] == 2.0
    from fnsysid.results.equations import show_text

    said = [ln for ln in show_text(out) if ln.startswith("sparsity: sparsity.threshold=auto")]
    sp = res.summary["sparsity"]
    assert said == [f"sparsity: sparsity.threshold=auto chose {sp['threshold']:g} "
                    f"({sp['terms']} terms) by BIC on the training data, the fewest terms "
                    "within sparsity.margin=2 of the best score"]


@pytest.mark.slow
def test_pendulum_at_100_hz_auto_keeps_the_five_true_terms(tmp_path):
    folder, _, _ = pendulum_fleet(tmp_path / "pendulum")
    for extra, rule in (([], "heldout"), (["data.holdout=0"], "bic")):
        res = run_pendulum(folder, "strategy=centralized_exact", "sparsity.threshold=auto",
                           *extra)
        assert kept(res) == PEND_TRUE and res.summary["status"] == "ok"
        assert res.summary["sparsity"]["rule"] == rule
        assert res.summary["sparsity"]["terms"] == 5


@pytest.mark.parametrize("bad", ["foo", "0", "-0.1", "true", "Auto", "inf"])
def test_bad_thresholds_are_refused_in_one_line(bad):
    with pytest.raises(ConfigError) as err:
        fnsysid.run(["system=linear", "feature_map=polynomial", "sparsity=stlsq",
                     f"sparsity.threshold={bad}", "R=1", "output.plot=false"])
    msg = str(err.value)
    assert "\n" not in msg and "sparsity.threshold" in msg
    assert "a finite number > 0 or auto" in msg


@pytest.mark.slow
@pytest.mark.flower
@pytest.mark.parametrize("val_N", [1, 0])
def test_flower_chooses_the_same_threshold_and_support_as_inprocess(val_N):
    from fnsysid.runtimes import check as runtime

    if not runtime.flower_installed():
        pytest.skip("Flower is not installed (extra: pip install -e '.[flower]')")
    args = ["system=linear", "M=4", "R=4", "repeats=2", "eps=0.3", "N=[3,5,2,4]",
            "feature_map=polynomial", "sparsity=stlsq", "sparsity.threshold=auto",
            "strategy=fedavg", f"data.val_N={val_N}", "output.plot=false"]
    a = fnsysid.run(args)
    b = fnsysid.run([*args, "runtime=flower"])
    sa, sb = a.summary["sparsity"], b.summary["sparsity"]
    assert sa["rule"] == sb["rule"] == ("heldout" if val_N else "bic")
    assert sa["threshold"] == sb["threshold"] and sa["support_size"] == sb["support_size"]
    np.testing.assert_allclose([r["score"] for r in sb["path"]],
                               [r["score"] for r in sa["path"]], rtol=1e-10)
    np.testing.assert_allclose(b.estimates["estimate"], a.estimates["estimate"], rtol=0,
                               atol=1e-10)
    assert ((b.estimates["estimate"] == 0) == (a.estimates["estimate"] == 0)).all()


def test_repeats_that_keep_different_terms_are_reported(tmp_path, caplog):
    # five clients of the dense synthetic family (15 true terms): each repeat's held-out
    # score picks its own support, which the summary and the log must say
    out = tmp_path / "run"
    with caplog.at_level("WARNING"):
        res = fnsysid.run(["system=synthetic", "M=5", "R=3", "repeats=5", "sparsity=stlsq",
                           "sparsity.threshold=auto", "output.plot=false", "progress=false"],
                          output_dir=out)
    est = res.estimates[res.estimates["client"] == "server"]
    kept_by = est.assign(kept=est["estimate"] != 0).pivot(index="repeat", columns="parameter",
                                                           values="kept")
    share = kept_by.mean(axis=0)
    disputed = int(((share > 0) & (share < 1)).sum())
    sp = res.summary["sparsity"]
    assert disputed > 0                              # the case is one of disagreement
    assert sp["repeats_agree"] is False and sp["terms_disputed"] == disputed
    assert sp["terms"] == kept_by.sum(axis=1).tolist()
    lines = [r.getMessage() for r in caplog.records if "repeats keep different" in r.getMessage()]
    assert len(lines) == 1
    assert f"{min(sp['terms'])} to {max(sp['terms'])} of 15" in lines[0]
    assert f"{disputed} terms kept in some repeats" in lines[0]


@pytest.mark.slow
def test_repeats_that_agree_log_nothing(tmp_path, caplog):
    folder, _, _ = pendulum_fleet(tmp_path / "pendulum")
    with caplog.at_level("WARNING"):
        res = run_pendulum(folder, "strategy=centralized_exact", "sparsity.threshold=auto")
    assert res.summary["sparsity"]["repeats_agree"] is True
    assert "terms_disputed" not in res.summary["sparsity"]
    assert not any("repeats keep different" in r.getMessage() for r in caplog.records)


def test_the_margin_takes_the_fewest_terms_among_scores_within_it():
    """sparsity.margin: candidates whose score is within the margin of the smallest count as
    equally good, and the one with the fewest terms is kept (then the smaller score, then the
    larger threshold); margin 0 is the smallest score, fewer terms on a tie."""
    from fnsysid.learning.sparsity import choose_on_path

    scores = np.array([[10.0, 9.0, 8.5, 8.0, 8.0], [5.0, 3.0, 3.0, 7.0, 2.5]])
    terms = np.array([[3, 5, 8, 21, 23], [9, 6, 6, 4, 7]])
    assert choose_on_path(scores, terms).tolist() == [3, 4]
    assert choose_on_path(scores, terms, 1.5).tolist() == [1, 2]   # row 2: a tie, larger t
    assert choose_on_path(scores, terms, 2.0).tolist() == [0, 2]   # 10 = 8 + 2 is within
    assert choose_on_path(scores, terms, 5.0).tolist() == [0, 3]
    # a NaN score is never chosen over a scored candidate, whatever its terms
    nan = np.array([[-100.0, -99.0, -50.0, np.nan]])
    assert choose_on_path(nan, np.array([[10, 6, 3, 0]]), 0.0).tolist() == [0]
    assert choose_on_path(nan, np.array([[10, 6, 3, 0]]), 2.0).tolist() == [1]


def test_the_auto_line_names_a_margin_of_0():
    from fnsysid.learning.sparsity import auto_choice

    said = {m: auto_choice({"auto": True, "threshold": 0.01, "margin": m, "rule": "heldout",
                            "terms": 5}) for m in (0.0, 2.0)}
    assert said[0.0] == ("sparsity: sparsity.threshold=auto chose 0.01 (5 terms) by the "
                         "held-out error of the pooled fits, the best score (sparsity.margin=0)")
    assert said[2.0].endswith("the fewest terms within sparsity.margin=2 of the best score")
