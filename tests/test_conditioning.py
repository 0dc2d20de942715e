"""The pooled Gram's condition number: computed on the kept terms, and a
status that is not ``ok`` (with a warning) when it leaves the estimate no correct digit."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

import fnsysid
from fnsysid.results.metrics import COND_LIMIT, gram_condition


def test_gram_condition_equals_numpy_on_the_kept_terms_scaled_to_unit_size():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(2, 3, 50, 4)) + np.array([0.0, 0.0, 1.0, 0.0])     # correlated
    X[..., 1] += 2 * X[..., 0]
    units = np.array([1.0, 1e3, 1e-3, 0.0])                                 # one zero column
    keep = np.array([[True, True, True, True], [True, False, True, True]])
    cond = gram_condition(np.einsum("smti,smtj->smij", X * units, X * units), keep)
    for s in range(2):
        use = keep[s] & (np.arange(4) < 3)
        Z = X[s].reshape(-1, 4)[:, use]
        Z = Z / np.linalg.norm(Z, axis=0)
        np.testing.assert_allclose(cond[s], np.linalg.cond(Z) ** 2, rtol=1e-6)
    # the data's units do not enter: the raw Gram's condition number is above 1e11
    Y = X * np.array([1.0, 1.0, 1.0, 0.0])
    same = gram_condition(np.einsum("smti,smtj->smij", Y, Y), keep)
    np.testing.assert_allclose(cond, same, rtol=1e-9)
    raw = np.linalg.cond(np.einsum("ti,tj->ij", *(2 * [(X * units)[0].reshape(-1, 4)[:, :3]])))
    assert raw > 1e11 and cond[0] < 100 and cond[1] < 100


def fleet(path, escape: bool):
    """Four clients of x+ = 0.9 x + 0.5 u (one state); with ``escape`` one trajectory of
    client c0 runs x+ = 2 x + u from 1, to about 1e14 after 47 steps."""
    rng = np.random.default_rng(0)
    rows = []
    for c in range(4):
        for j in range(3):
            T = 48
            x, u = np.empty(T), rng.normal(size=T)
            x[0] = rng.normal()
            grow = escape and c == 0 and j == 0
            if grow:
                x[0] = 1.0
            for t in range(T - 1):
                x[t + 1] = 2 * x[t] + u[t] if grow else 0.9 * x[t] + 0.5 * u[t] + \
                    0.01 * rng.normal()
            rows.append(pd.DataFrame({"client": f"c{c}", "trajectory": j, "x": x, "u": u,
                                      "split": "train" if j < 2 else "val"}))
    file = path / "fleet.csv"
    pd.concat(rows).to_csv(file, index=False)
    return file


def run(file, inputs="[u]", degree=3):
    return fnsysid.run(["system=generic", "data=files", f"data.path={file}", "data.states=[x]",
                        f"data.inputs={inputs}", "feature_map=polynomial",
                        f"feature_map.degree={degree}", "strategy=centralized_exact",
                        "output.plot=false", "progress=false"])


@pytest.mark.slow
def test_units_do_not_make_a_fit_ill_conditioned(tmp_path):
    # the same fleet with the input in units 1e6 times smaller: the raw Gram's condition
    # number grows by 1e12 per degree, the equilibrated one (what the solve inverts) not at all
    file = fleet(tmp_path, escape=False)
    small = tmp_path / "small.csv"
    pd.read_csv(file).assign(u=lambda d: d["u"] * 1e6).to_csv(small, index=False)
    a, b = run(file), run(small)
    assert a.summary["status"] == b.summary["status"] == "ok"
    np.testing.assert_allclose(b.summary["conditioning"]["cond"], a.summary["conditioning"]
                               ["cond"], rtol=1e-6)
    ea = a.estimates.set_index("parameter")["estimate"]
    eb = b.estimates.set_index("parameter")["estimate"]
    power = np.array([sum(int(k or 1) for k in re.findall(r"u(?:\^(\d))?", name))
                      for name in ea.index])                 # u's degree in each feature
    assert power.tolist() == [0, 0, 1, 0, 1, 2, 0, 1, 2, 3]
    np.testing.assert_allclose(eb.to_numpy() * 1e6 ** power, ea.to_numpy(), rtol=1e-6,
                               atol=1e-9)


@pytest.mark.slow
def test_an_input_logged_twice_makes_the_status_ill_conditioned(tmp_path, caplog):
    caplog.set_level("WARNING", logger="fnsysid")
    file = fleet(tmp_path, escape=False)
    good = run(file, degree=1)
    assert good.summary["status"] == "ok"
    assert good.summary["conditioning"]["cond"][0] < 1e3
    assert not [r for r in caplog.records if "condition number" in r.getMessage()]
    twice = tmp_path / "twice.csv"
    pd.read_csv(file).assign(u_mv=lambda d: 1000 * d["u"]).to_csv(twice, index=False)
    bad = run(twice, inputs="[u,u_mv]", degree=1)
    c = bad.summary["conditioning"]
    assert bad.summary["status"] == "ill_conditioned" and c["repeats"] == [0]
    assert c["cond"][0] >= COND_LIMIT and c["limit"] == COND_LIMIT
    said = [r.getMessage() for r in caplog.records if "condition number" in r.getMessage()]
    assert len(said) == 1 and "status: ill_conditioned" in said[0]


@pytest.mark.slow
def test_an_escaping_trajectory_leaves_the_other_clients_no_digit(tmp_path, caplog):
    # one trajectory at 1e14: the equilibrated Gram is well conditioned (x, x^2, x^3 of a
    # geometric sequence are distinct regressors), but the estimate's round-off, of the
    # escaping data's size, is thousands of times the other clients' data: ill_conditioned
    caplog.set_level("WARNING", logger="fnsysid")
    bad = run(fleet(tmp_path, escape=True))
    c = bad.summary["conditioning"]
    assert 1e3 < c["cond"][0] < 1e9 and "repeats" not in c
    assert bad.summary["status"] == "ill_conditioned"
    assert c["roundoff"]["clients"] == ["c1", "c2", "c3"] and c["roundoff"]["repeats"] == [0]
    assert c["roundoff"]["worst_ratio"] > 0.05 and c["roundoff"]["cause"] == "scale"
    said = [r.getMessage() for r in caplog.records if "round-off" in r.getMessage()]
    assert len(said) == 1 and "clients c1, c2, c3" in said[0] and \
        "status: ill_conditioned" in said[0]
    assert not [r for r in caplog.records if "status ok" in r.getMessage()]
    # without it, or with the same fleet in other units, nothing is flagged
    for file in (fleet(tmp_path, escape=False), tmp_path / "small.csv"):
        if file.name == "small.csv":
            pd.read_csv(fleet(tmp_path, escape=False)).assign(
                x=lambda d: d["x"] * 1e-6).to_csv(file, index=False)
        good = run(file)
        assert good.summary["status"] == "ok" and "roundoff" not in good.summary["conditioning"]


def test_the_command_line_exits_3_on_an_ill_conditioned_pooled_fit(tmp_path):
    """A pooled fit whose Gram is singular to working precision (an input logged twice, in
    two units) is not printed as ok: exit code 3, the summary's status and an error line
    naming it."""
    import json

    from tests.conftest import cli_in_process

    file = fleet(tmp_path, escape=False)
    twice = tmp_path / "twice.csv"
    pd.read_csv(file).assign(u_mv=lambda d: 1000 * d["u"]).to_csv(twice, index=False)
    out = tmp_path / "run"
    res = cli_in_process("system=generic", "data=files", f"data.path={twice}",
                         "data.states=[x]", "data.inputs=[u,u_mv]", "feature_map=polynomial",
                         "feature_map.degree=1", "strategy=centralized_exact",
                         "output.plot=false", "progress=false", f"hydra.run.dir={out}")
    assert res.returncode == 3
    assert "status: ill_conditioned" in res.stdout + res.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "ill_conditioned"
    assert summary["conditioning"]["repeats"] == [0]
    # the warning names the terms that repeat each other, as does `fnsysid show` (whose
    # condition number is null in the JSON: inf)
    rep = summary["conditioning"]["repeated"]
    assert rep["target"] == "x+" and rep["terms"] == ["u_mv", "u"]
    np.testing.assert_allclose(rep["weights"], [1.0, -1000.0], rtol=1e-9)
    assert "the terms u_mv, u of x+ repeat each other" in res.stdout + res.stderr
    assert "or a trajectory that escapes" in res.stdout + res.stderr
    assert "u_mv - 1e+03 u = 0" in res.stdout + res.stderr
    shown = cli_in_process("show", str(out))
    assert shown.returncode == 3, shown.stderr
    line = next(x for x in shown.stdout.splitlines() if x.startswith("conditioning:"))
    assert "reaches 1/eps in repeat(s) 0" in line and "the terms u_mv, u of x+" in line


def test_an_ill_conditioned_run_does_not_also_say_status_ok(tmp_path, caplog):
    # the escaping fleet's free run is far worse than the held-out mean; with its input
    # logged twice the fit is ill-conditioned: the free-run line, which says "status ok",
    # is left out (it was logged before the status was judged)
    caplog.set_level("WARNING", logger="fnsysid")
    file = fleet(tmp_path, escape=True)
    twice = tmp_path / "twice.csv"
    pd.read_csv(file).assign(u_mv=lambda d: 1000 * d["u"]).to_csv(twice, index=False)
    res = run(twice, inputs="[u,u_mv]")
    assert res.summary["status"] == "ill_conditioned"
    assert res.summary["final_nrmse_sim_mean"] > 1
    said = [r.getMessage() for r in caplog.records]
    assert any("status: ill_conditioned" in m for m in said)
    assert not [m for m in said if "status ok" in m]


def amplitude_fleet(path, k: float):
    """Four clients of x+ = 0.9 x + 0.5 u + 0.01 e; one trajectory of client c0 driven with
    inputs k times larger (its states follow: valid data of the same system)."""
    rng = np.random.default_rng(1)
    rows = []
    for c in range(4):
        for j in range(3):
            big = k if (c, j) == (0, 0) else 1.0
            x, u = np.empty(48), big * rng.normal(size=48)
            x[0] = big * rng.normal()
            for t in range(47):
                x[t + 1] = 0.9 * x[t] + 0.5 * u[t] + 0.01 * rng.normal()
            rows.append(pd.DataFrame({"client": f"c{c}", "trajectory": j, "x": x, "u": u,
                                      "split": "train" if j < 2 else "val"}))
    file = path / f"amplitude{k:g}.csv"
    pd.concat(rows).to_csv(file, index=False)
    return file


@pytest.mark.slow
def test_a_valid_trajectory_far_larger_than_the_others_is_not_flagged(tmp_path):
    # driven 1e8 times harder, one trajectory dominates the sums, yet the others' held-out
    # error is that of the small fleet: the perturbed solves move their predictions by
    # about 1e-8 of their data (a bound of cond eps ||z|| had said 10 and more)
    small, big = (run(amplitude_fleet(tmp_path, k)) for k in (1.0, 1e8))
    assert big.summary["status"] == "ok" and "roundoff" not in big.summary["conditioning"]
    assert big.summary["final_nrmse_1step_mean"] == pytest.approx(
        small.summary["final_nrmse_1step_mean"], rel=0.02)


@pytest.mark.slow
def test_data_far_from_0_beside_their_spread_are_not_printed_as_ok(tmp_path, caplog):
    """Tanks about an operating point (tests/test_sparsity.py: offset_tanks), a degree-2
    library: at 1000 the pooled least squares keeps no digit of the predictions (one-step
    NRMSE 7.0 against 0.049 about 0), which a ratio to the targets' norm (1000 and more) did
    not see: status ok before. Measured against a stable solve, the loss is 10 times the
    targets' spread: flagged, the cause named, and neither Cochran's Q nor the model check
    read on the own fits that carry it. The affine library about 1000 and the degree-2 one
    about 0 stay ok."""
    from tests.test_sparsity import offset_tanks

    caplog.set_level("WARNING", logger="fnsysid")

    def fit(offset, library):
        file, _, _ = offset_tanks(tmp_path, offset)
        return fnsysid.run(["system=generic", "data=files", f"data.path={file}",
                            "data.states=[x1]", "data.inputs=[u]", f"feature_map={library}",
                            *(["feature_map.degree=2"] if library == "polynomial" else []),
                            "strategy=centralized_exact",
                            "output.plot=false", "progress=false"],
                           output_dir=tmp_path / f"{library}{offset:g}")

    good, affine, bad = fit(0.0, "polynomial"), fit(1000.0, "affine"), fit(1000.0, "polynomial")
    for res in (good, affine):
        assert res.summary["status"] == "ok" and "roundoff" not in res.summary["conditioning"]
        assert res.summary["model_check"]["verdict"] == "ok"
    assert affine.summary["final_nrmse_1step_mean"] == pytest.approx(
        good.summary["final_nrmse_1step_mean"], rel=1e-3)
    assert bad.summary["final_nrmse_1step_mean"] > 50 * good.summary["final_nrmse_1step_mean"]
    assert bad.summary["status"] == "ill_conditioned"
    r = bad.summary["conditioning"]["roundoff"]
    assert r["cause"] == "offset" and r["worst_ratio"] > 1 and len(r["clients"]) == 20
    assert bad.summary["model_check"]["verdict"] is None
    assert "far from 0" in bad.summary["model_check"]["reason"]
    differ = bad.summary["ci"]["clients_differ"]
    assert differ["rejected"] == [True] and differ["read"] is False
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "Cochran's Q" in m or "status ok" in m]
    line = [m for m in said if "round-off" in m]
    assert len(line) == 1 and "targets about 1e+03 moving by 0.145" in line[0]
    assert "subtract an operating point" in line[0]
    from fnsysid.results.equations import show_text

    shown = [ln for ln in show_text(tmp_path / "polynomial1000") if ln.startswith("conditioning")]
    assert shown == [f"conditioning: the round-off of the pooled sums moves the predictions of "
                     f"c0, c1, c10, c11, c12 and 15 more by up to {r['worst_ratio']:.3g} times "
                     f"their targets' spread (the data sit far from 0 beside their spread: "
                     f"subtract an operating point)"]
    assert not [ln for ln in show_text(tmp_path / "polynomial0") if "conditioning" in ln]


@pytest.mark.slow
def test_a_state_far_from_0_is_not_hidden_by_another_that_moves_a_lot(tmp_path):
    """A tank about 500 (x1) beside an oscillator about 0 a hundred times its spread (x2,
    x3), degree 2: x1's predictions keep no digit (free-run NRMSE 3.0 against 0.17 about
    0). The targets' spreads summed, x2's hid x1's loss: status ok on seeds 0 and 1; each
    target against its own spread, the loss is 0.32 and 0.88 of x1's spread:
    ill_conditioned, cause offset."""
    from tests.conftest import engine
    from tests.test_sparsity import offset_tanks

    for seed in (0, 1):
        runs = {}
        for offset in (0.0, 500.0):
            file, _, _ = offset_tanks(tmp_path, offset, moving=100.0, seed=seed)
            runs[offset] = engine(
                "system=generic", "data=files", f"data.path={file}", "data.states=[x1,x2,x3]",
                "data.inputs=[u]", "feature_map=polynomial", "feature_map.degree=2",
                "strategy=centralized_exact", "output.model_check=false", "output.plot=false",
                "progress=false").summary
        assert runs[0.0]["status"] == "ok" and "roundoff" not in runs[0.0]["conditioning"]
        assert runs[500.0]["final_nrmse_sim_mean"] > 10 * runs[0.0]["final_nrmse_sim_mean"]
        r = runs[500.0]["conditioning"]["roundoff"]
        assert runs[500.0]["status"] == "ill_conditioned"
        assert r["cause"] == "offset" and r["worst_ratio"] > 0.1 and len(r["clients"]) == 20


def test_a_spread_below_the_precision_of_the_sums_is_measured_against_that_precision():
    """A target held at 1000 +- 1e-6: its spread, summed squares less n mean^2, is rounding
    (about 1e-18 of its summed squares); it was flagged or not by the rounding of the
    subtraction. Below SPREAD_PRECISION of the summed squares the loss is measured against
    that share (far below the limit here); a target that moves, against its spread."""
    from fnsysid.dynamics.model import ClientData
    from fnsysid.results.metrics import SPREAD_PRECISION, roundoff_facts

    rng = np.random.default_rng(0)
    n = 200
    X = np.stack([np.ones(n), rng.normal(size=n)], axis=1)
    stats = []
    for y in (1000 + 1e-6 * rng.normal(size=n), X[:, 1] + 0.1 * rng.normal(size=n)):
        stats.append((X.T @ X, X.T @ y, y @ y, y.mean()))
    H, b, yy, ym = (np.array([[s[k] for s in stats]]) for k in range(4))
    data = ClientData(np.zeros((1, 2, 2)), H, b, yy, np.full((1, 2), float(n)),
                      y_mean=ym[..., None], yy_target=yy[..., None])
    spread = yy - n * ym ** 2
    assert abs(spread[0, 0]) < SPREAD_PRECISION * yy[0, 0]
    facts = roundoff_facts(data, enters=np.ones((1, 2), bool))
    assert 0 <= facts["ratio"][0, 0] < 1e-6 and 0 <= facts["ratio"][0, 1] < 1e-10


@pytest.mark.slow
def test_own_fits_that_lose_their_digits_judge_the_runs_that_use_them(tmp_path, caplog):
    """Ten tanks without an intercept at operating points 50, 100, ..., 500, degree 2: the
    pooled least squares keeps its digits (one-step NRMSE 0.0617 against 0.0616 at 0), the
    clients' own fits do not (their loss against a stable solve reaches 1.5 times a
    target's spread). `centralized_exact` stays ok and only the model check, which fits
    them, gives no verdict; FedAvg with local steps whitened by each client's own Gram
    matrix (the generic default) ends at NRMSE 546 and was ok before: ill_conditioned. So
    is `centralized_exact` with `personalize=auto`, whose homogeneity test, heterogeneity
    and intervals are fitted to the own fits (it was ok)."""
    from tests.conftest import engine
    from tests.test_sparsity import offset_tanks

    caplog.set_level("WARNING", logger="fnsysid")
    file, _, _ = offset_tanks(tmp_path, 50.0, spacing=50.0, intercept=False, M=10)
    runs = {(s, p): engine("system=generic", "data=files", f"data.path={file}",
                           "data.states=[x1]", "data.inputs=[u]", "feature_map=polynomial",
                           "feature_map.degree=2", f"strategy={s}", f"personalize={p}",
                           "output.plot=false", "progress=false").summary
            for s, p in (("centralized_exact", "none"), ("fedavg", "none"),
                         ("centralized_exact", "auto"))}
    exact, fedavg = runs["centralized_exact", "none"], runs["fedavg", "none"]
    assert exact["status"] == "ok" and exact["final_nrmse_1step_mean"] < 0.07
    r = exact["conditioning"]["roundoff"]
    assert r["of"] == "own fits" and r["status"] is False and r["worst_ratio"] > 1
    assert exact["model_check"]["verdict"] is None
    assert fedavg["status"] == "ill_conditioned" and fedavg["final_nrmse_1step_mean"] > 100
    assert fedavg["conditioning"]["roundoff"]["status"] is True
    auto = runs["centralized_exact", "auto"]
    assert auto["status"] == "ill_conditioned" and auto["conditioning"]["roundoff"]["status"]
    assert auto["final_nrmse_1step_mean"] == exact["final_nrmse_1step_mean"]
    said = [m.getMessage() for m in caplog.records if "own least squares" in m.getMessage()]
    assert len(said) == 3 and "(status unchanged)" in said[0] and "ill_conditioned" in said[1]
    assert "made from them: the estimate (local steps whitened" in said[1]
    assert "made from them: the personalized models of personalize=auto" in said[2]


def shifted_duffing(path, base, seed, M=10, runs=4, T=200, noise=1e-6, dt=0.05):
    """Identical nearly noise-free Duffing clients (``v+ = v + dt (-x - 0.3 v - x^3 + 2 u)``)
    whose states and input are all shifted by ``base``: with a constant in the library the
    exact least squares predicts the same at any ``base``."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(M):
        for j in range(runs):
            u = rng.normal(size=T + 1)
            x = np.zeros((T + 1, 2))
            x[0] = rng.normal(size=2)
            for t in range(T):
                p, v = x[t]
                x[t + 1] = [p + dt * v, v + dt * (-p - 0.3 * v - p ** 3 + 2 * u[t])]
                x[t + 1] += noise * rng.normal(size=2)
            rows.append(pd.DataFrame({"client": f"c{i:02d}", "trajectory": j,
                                      "t": np.arange(T + 1),
                                      "split": "val" if j == runs - 1 else "train",
                                      "x1": x[:, 0] + base, "x2": x[:, 1] + base,
                                      "u": u + base}))
    file = path / f"duffing{base:g}_{seed}.csv"
    pd.concat(rows).to_csv(file, index=False)
    return file


@pytest.mark.slow
def test_own_fits_at_their_rounding_do_not_make_identical_clients_differ(tmp_path, caplog):
    """Ten identical Duffing clients, noise 1e-6, shifted by 20, degree 3: the own fits'
    round-off is below 1 % of the spread (no roundoff flag) but far above the noise, and
    the model check finds them at their solve's rounding (unresolved). Cochran's Q, which
    measures differences against the noise, rejected (p = 0) and a warning said the
    identical clients differ; it is not read now. Unshifted, Q does not reject."""
    from tests.conftest import engine

    caplog.set_level("WARNING", logger="fnsysid")
    for seed in (0, 2):
        res = {}
        for base in (0.0, 20.0):
            res[base] = engine(
                "system=generic", "data=files",
                f"data.path={shifted_duffing(tmp_path, base, seed)}", "data.states=[x1,x2]",
                "data.inputs=[u]", "feature_map=polynomial", "feature_map.degree=3",
                "strategy=centralized_exact", "output.plot=false", "progress=false").summary
        assert res[0.0]["ci"]["clients_differ"]["rejected"] == [False]
        shifted = res[20.0]
        assert "roundoff" not in shifted["conditioning"] and shifted["status"] == "ok"
        assert shifted["model_check"]["unresolved"] > 0
        differ = shifted["ci"]["clients_differ"]
        assert differ["rejected"] == [True] and differ["read"] is False
        assert "model_check.unresolved" in differ["why"]
    assert not [r for r in caplog.records if "Cochran's Q" in r.getMessage()]


def tanks_with_a_held_input(path, seed, held=1, held_sd=1e-6, M=10, runs=5, T=200,
                            base=5.0, noise=0.01):
    """Tanks ``x+ = 0.98 x + 0.02 u + noise w`` with inputs about ``base`` (sd 1); the first
    ``held`` clients hold their input at ``base`` with a spread of ``held_sd``."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(M):
        for j in range(runs):
            u = base + (held_sd if i < held else 1.0) * rng.normal(size=T + 1)
            x = np.empty(T + 1)
            x[0] = base + rng.normal()
            for t in range(T):
                x[t + 1] = 0.98 * x[t] + 0.02 * u[t] + noise * rng.normal()
            rows.append(pd.DataFrame({"client": f"c{i:02d}", "trajectory": j,
                                      "t": np.arange(T + 1),
                                      "split": "val" if j == runs - 1 else "train",
                                      "x1": x, "u": u}))
    file = path / f"held_{seed}_{held}_{held_sd:g}_{noise:g}.csv"
    pd.concat(rows).to_csv(file, index=False)
    return file


@pytest.mark.parametrize("seed", [0, 4])
def test_an_input_one_client_holds_is_named_not_taken_for_an_offset(tmp_path, caplog, seed):
    """One client of ten holds its input at 5 (spread 1e-6) beside the constant of an affine
    library: its own least squares lose their digits along the input, whose coefficient its
    data hardly determine. FedAvg's whitened local steps are made from them: the line names
    the input and the client and does not advise an operating point, which would not mend
    it alone (it said "targets about 5.11 moving by 0.418 ... subtract an operating point").
    With every input moving, nothing is flagged."""
    from tests.conftest import engine

    caplog.set_level("WARNING", logger="fnsysid")
    base = ("system=generic", "data=files", "data.states=[x1]", "data.inputs=[u]",
            "feature_map=affine", "output.plot=false", "progress=false")
    held = engine(*base, f"data.path={tanks_with_a_held_input(tmp_path, seed)}").summary
    assert held["status"] == "ill_conditioned"
    r = held["conditioning"]["roundoff"]
    assert r["of"] == "own fits" and r["clients"] == ["c00"] and r["cause"] == "offset"
    assert r["term"]["name"] == "u" and r["term"]["client"] == "c00"
    assert abs(r["term"]["mean"] - 5) < 1e-5 and 5e-7 < r["term"]["sd"] < 2e-6
    said = [m.getMessage() for m in caplog.records if "own least squares" in m.getMessage()]
    assert len(said) == 1 and "the term u barely moves in client c00's data" in said[0]
    assert "where u moves by little more than the noise, those data hardly determine its " \
        "coefficient at all, which that does not mend" in said[0]
    assert "targets about" not in said[0]
    moving = engine(*base, f"data.path={tanks_with_a_held_input(tmp_path, seed, held=0)}")
    assert moving.summary["status"] == "ok"
    assert "roundoff" not in moving.summary["conditioning"]


def test_the_error_a_mean_of_own_fits_adds_is_the_trace_of_its_covariance():
    """own_mean_error against a direct computation on a small affine fleet: the mean of
    four clients' own fits errs with covariance sum_i V_i / 16, V_i = s^2 H_i^-1 (s^2 the
    clients' median residual variance), which adds trace(Hbar V) to the one-step mean
    squared error over the pooled samples; one client's input barely moves."""
    from types import SimpleNamespace

    from fnsysid.results.metrics import own_mean_error

    rng = np.random.default_rng(0)
    M, n = 4, 60
    X = np.stack([np.column_stack([np.ones(n), rng.normal(size=n),
                                   5 + (1e-3 if i == 0 else 1.0) * rng.normal(size=n)])
                  for i in range(M)])                                   # features 1, x, u
    y = X @ np.array([0.1, 0.9, 0.2]) + 0.05 * rng.normal(size=(M, n))
    H = np.einsum("mti,mtj->mij", X, X)[None]
    b = np.einsum("mti,mt->mi", X, y)[None]
    data = SimpleNamespace(H=H, b=b, n=np.full((1, M), float(n)),
                           yy_target=(y ** 2).sum(axis=1)[None, :, None],
                           y_mean=y.mean(axis=1)[None, :, None])
    model = SimpleNamespace(structure=np.eye(3)[None])                  # one target
    err = own_mean_error(model, data, None, None)
    theta = np.linalg.solve(H[0], b[0][..., None])[..., 0]
    s2 = np.median([((y[i] - X[i] @ theta[i]) ** 2).sum() / (n - 3) for i in range(M)])
    V = sum(s2 * np.linalg.inv(H[0, i]) for i in range(M)) / M ** 2
    Hbar = H[0].sum(axis=0) / (M * n)
    var = sum(((y[i] - y[i].mean()) ** 2).sum() for i in range(M)) / (M * n)
    # (the held client's Gram matrix has condition number about 1e8: its residual sum from
    # the sums, yy - theta'b, and the inverses agree with the direct ones to about 1e-6)
    assert err["nrmse"][0, 0] == pytest.approx(np.sqrt(np.trace(Hbar @ V) / var), rel=1e-5)
    share = err["share"][0, 0]
    assert share.sum() == pytest.approx(1.0) and share.argmax() == 0 and share[0] > 0.99
    assert err["coefficient"][0, 0, 0] == 2                              # u
    # a coefficient entering two targets: no answer
    assert own_mean_error(SimpleNamespace(structure=np.ones((2, 3, 3))), data) is None


def test_own_fits_that_interpolate_their_data_are_judged_on_the_pooled_noise(caplog):
    """Clients with as many samples as coefficients (N=1, T=5, five per target): each own fit
    interpolates its data and has no residual variance of its own. own_mean_error took that
    0/0 as no error, and ``oneshot``'s mean of ten such fits, one-step NRMSE 3 where the pooled
    fit gives 0.7, was ok without a word. The noise is now the pooled fit's residual
    variance: against a direct computation, and the run warns."""
    from types import SimpleNamespace

    from fnsysid.results.metrics import own_mean_error
    from tests.conftest import engine

    rng = np.random.default_rng(1)
    M, n = 6, 3
    X = rng.normal(size=(M, n, 3))
    y = X @ np.array([0.5, -0.2, 0.1]) + 0.1 * rng.normal(size=(M, n))
    H = np.einsum("mti,mtj->mij", X, X)[None]
    b = np.einsum("mti,mt->mi", X, y)[None]
    data = SimpleNamespace(H=H, b=b, n=np.full((1, M), float(n)),
                           yy_target=(y ** 2).sum(axis=1)[None, :, None],
                           y_mean=y.mean(axis=1)[None, :, None])
    err = own_mean_error(SimpleNamespace(structure=np.eye(3)[None]), data)
    Xp, yp = X.reshape(-1, 3), y.ravel()
    pooled = np.linalg.lstsq(Xp, yp, rcond=None)[0]
    s2 = ((yp - Xp @ pooled) ** 2).sum() / (M * n - 3)
    V = sum(s2 * np.linalg.inv(H[0, i]) for i in range(M)) / M ** 2
    var = sum(((y[i] - y[i].mean()) ** 2).sum() for i in range(M)) / (M * n)
    expected = np.sqrt(np.trace(H[0].sum(axis=0) / (M * n) @ V) / var)
    assert err["nrmse"][0, 0] == pytest.approx(expected, rel=1e-9)
    assert err["fits"][0, 0] == M

    caplog.set_level("WARNING", logger="fnsysid")
    base = ("system=synthetic", "eps=0", "N=1", "T=5", "M=10", "repeats=2", "R=1",
            "output.plot=false", "progress=false")
    one = engine(*base, "strategy=oneshot").summary
    exact = engine(*base, "strategy=centralized_exact").summary
    assert one["status"] == "ok" and "own_precision" not in exact["conditioning"]
    added = one["conditioning"]["own_precision"]["nrmse_added"]     # worst repeat and target
    # what the pooled fit saves on the held-out one-step NRMSE (1.55 against 0.86)
    excess = np.sqrt(one["final_nrmse_1step_mean"] ** 2 - exact["final_nrmse_1step_mean"] ** 2)
    assert 1 < excess < added < 2
    # no interval, and the reason (the summary named a method beside empty columns)
    assert one["ci"]["estimates"].startswith("average of the clients' least squares: no "
                                             "client has more samples than coefficients")
    assert one["ci"]["method"] == "no intervals in this run (ci.estimates says why)"
    assert exact["ci"]["method"].startswith("estimates: Student's t on the pooled residual")
    assert any("own fits alone adds" in m.getMessage() for m in caplog.records)


@pytest.mark.slow
def test_a_mean_of_own_fits_spoilt_by_one_imprecise_client_says_so(tmp_path, caplog):
    """One tank of ten holds its input at 5 (spread 1e-6; seed 1: its own fit keeps its
    digits): its own least squares hardly determine the input's coefficient, and FedAvg with
    whitened local steps, which reaches the mean of the own fits, ends at one-step NRMSE 66
    (pooled least squares 0.04; the expected error of that mean alone, 96). The status stays
    ok (it is about the rounds) but a warning names the client and the coefficient, and the
    free-run line blames the estimate, not the library (it pointed at another library). With
    every input moving, with centralized_exact, and where the noise is too small for the
    imprecision to matter, nothing is said."""
    from tests.conftest import engine

    caplog.set_level("WARNING", logger="fnsysid")
    base = ("system=generic", "data=files", "data.states=[x1]", "data.inputs=[u]",
            "feature_map=affine", "output.plot=false", "progress=false")
    file = tanks_with_a_held_input(tmp_path, 1)
    fedavg = engine(*base, f"data.path={file}").summary
    assert fedavg["status"] == "ok" and fedavg["final_nrmse_1step_mean"] > 10
    p = fedavg["conditioning"]["own_precision"]
    assert p["clients"] == ["c00"] and p["coefficient"] == "x1+:u" and p["share"] > 0.99
    assert 30 < p["nrmse_added"] < 300                      # realized here: 66
    said = [m.getMessage() for m in caplog.records]
    assert any(m.startswith("the estimation error of the clients' own fits alone adds a "
                            "one-step NRMSE of") and "client c00's" in m for m in said)
    assert any("the estimate, not the library, is poor" in m for m in said)
    caplog.clear()
    exact = engine(*base, f"data.path={file}", "strategy=centralized_exact").summary
    assert exact["final_nrmse_1step_mean"] < 0.05
    assert "own_precision" not in exact["conditioning"]
    moving = engine(*base, f"data.path={tanks_with_a_held_input(tmp_path, 1, held=0)}")
    assert "own_precision" not in moving.summary["conditioning"]
    assert not any("estimation error of the clients' own fits" in m.getMessage()
                   for m in caplog.records)
    # an input that moves 1000 times less in one client, with nearly no noise: the mean of
    # the own fits is exact, nothing is said
    quiet = engine(*base, "data.path=" + str(tanks_with_a_held_input(
        tmp_path, 1, held_sd=1e-3, noise=1e-6))).summary
    assert quiet["final_nrmse_1step_mean"] < 1e-3
    assert "own_precision" not in quiet["conditioning"]


@pytest.mark.slow
def test_an_added_error_below_the_level_but_above_the_noise_is_said(tmp_path, caplog):
    """One tank of ten holds its input with a spread of 3e-4, noise 1e-3: the mean of the own
    fits adds an expected one-step NRMSE of about 0.03, under the level of 0.1 but ten times
    the noise's own (about 0.003): FedAvg's held-out one-step NRMSE is 0.022 against the
    pooled least squares' 0.004, which a fixed level let pass in silence (a short Duffing
    client turned a cubic's sign so). The warning gives both numbers."""
    from fnsysid.results.metrics import MEAN_ERROR_FLOOR, MEAN_ERROR_LEVEL
    from tests.conftest import engine

    caplog.set_level("WARNING", logger="fnsysid")
    base = ("system=generic", "data=files", "data.states=[x1]", "data.inputs=[u]",
            "feature_map=affine", "output.plot=false", "progress=false")
    file = tanks_with_a_held_input(tmp_path, 1, held_sd=3e-4, noise=1e-3)
    fedavg = engine(*base, f"data.path={file}").summary
    exact = engine(*base, f"data.path={file}", "strategy=centralized_exact").summary
    p = fedavg["conditioning"]["own_precision"]
    assert MEAN_ERROR_FLOOR < p["nrmse_added"] < MEAN_ERROR_LEVEL
    assert 5 * p["noise"] < p["nrmse_added"] and p["clients"] == ["c00"]
    assert fedavg["final_nrmse_1step_mean"] > 4 * exact["final_nrmse_1step_mean"]
    said = [m.getMessage() for m in caplog.records if "own fits alone adds" in m.getMessage()]
    assert len(said) == 1 and f"(the noise's own: {p['noise']:.3g})" in said[0]
    assert "own_precision" not in exact["conditioning"]


def test_an_error_spread_over_every_client_names_none(caplog):
    """One trajectory of 10 samples per client (synthetic, ``oneshot``): every own fit is
    imprecise and no client adds a tenth of what the mean's estimation error adds (the
    largest about 8 %). The run says so, naming no client, where it raised an IndexError
    looking for one; the added error is what the pooled fit saves (held-out one-step NRMSE
    0.752 against 0.738: sqrt(0.752^2 - 0.738^2) = 0.14, the worst target's expected 0.21).
    Five clients of about a fifth each are not named either (:func:`standing_out`)."""
    from fnsysid.app.experiment import standing_out
    from fnsysid.results.modelcheck import own_precision_who
    from tests.conftest import engine

    caplog.set_level("WARNING", logger="fnsysid")
    base = ("system=synthetic", "N=1", "T=10", "output.plot=false", "progress=false")
    one = engine(*base, "strategy=oneshot").summary
    p = one["conditioning"]["own_precision"]
    assert one["status"] == "ok" and p["clients"] == [] and p["share"] < 0.1
    assert p["largest"] in {str(m) for m in range(20)}
    said = [m.getMessage() for m in caplog.records if "own fits alone adds" in m.getMessage()]
    assert len(said) == 1 and "no client stands out" in said[0] and "of 20 fits" in said[0]
    assert "spread over the fits" in own_precision_who(p)
    exact = engine(*base, "strategy=centralized_exact").summary
    assert "own_precision" not in exact["conditioning"]
    excess = np.sqrt(one["final_nrmse_1step_mean"] ** 2 - exact["final_nrmse_1step_mean"] ** 2)
    assert 0.05 < excess < p["nrmse_added"] < 0.4
    assert standing_out(np.array([0.22, 0.2, 0.2, 0.19, 0.19]), 5) == []
    assert standing_out(np.array([0.5, 0.1, 0.1, 0.1, 0.1, 0.1]), 6) == [0]
    assert standing_out(np.array([1.0]), 1) == []
    caplog.clear()
    alone = engine(*base, "strategy=oneshot", "M=1", "repeats=1").summary
    assert alone["conditioning"]["own_precision"]["clients"] == []
    said = [m.getMessage() for m in caplog.records if "adds a one-step NRMSE" in m.getMessage()]
    assert len(said) == 1 and said[0].startswith("the estimation error of the one client's own "
                                                 "fit (client 0's)")


@pytest.mark.slow
def test_data_whose_spread_is_below_the_precision_of_the_sums_are_judged(tmp_path):
    """Tanks whose state and input sit about 1e6 and move by about 0.3 and 1: a target's
    spread is below SPREAD_PRECISION of its summed squares, and the run was not judged
    (`ok` at one-step NRMSE 10032 with centralized_exact). The loss is measured against that
    share of the summed squares: ill_conditioned."""
    from tests.conftest import engine

    file = tanks_with_a_held_input(tmp_path, 2, held=0, base=1e6)
    summary = engine("system=generic", "data=files", f"data.path={file}", "data.states=[x1]",
                     "data.inputs=[u]", "feature_map=affine", "strategy=centralized_exact",
                     "output.plot=false", "progress=false").summary
    assert summary["final_nrmse_1step_mean"] > 100
    assert summary["status"] == "ill_conditioned"
    r = summary["conditioning"]["roundoff"]
    assert r["of"] == "pooled sums" and r["cause"] == "offset" and r["worst_ratio"] > 10


def test_show_reads_a_singular_gram_whose_condition_number_is_null():
    """``summary.json`` holds a singular Gram's infinite condition number as null: ``fnsysid
    show``'s line says inf (it raised on an empty max) and names the repeated terms."""
    from fnsysid.results.equations import _conditioning_line

    cond = {"cond": [None, 12.0], "limit": COND_LIMIT, "repeats": [0],
            "repeated": {"repeat": 0, "target": "x1+", "terms": ["x1copy", "x1"],
                         "weights": [1.0, -1.0], "relation": "x1copy - 1 x1 = 0"}}
    line = _conditioning_line(cond)
    assert line.startswith("conditioning: the pooled Gram matrix's condition number inf "
                           "reaches 1/eps in repeat(s) 0")
    # an affine dependence reads with the constant's weight alone, and a term of a small
    # weight stays in it (big = 1000 u + x: not "big - 1e+03 u")
    from fnsysid.results.metrics import repeated_terms

    rng = np.random.default_rng(0)
    x, u = rng.normal(size=200), rng.normal(size=200)
    for extra, names, relation in [(5 + 3 * u, ["1", "x", "u", "aff"], "aff - 5 - 3 u = 0"),
                                   (1000 * u + x, ["1", "x", "u", "big"],
                                    "big - 1e+03 u - 1 x = 0")]:
        F = np.stack([np.ones(200), x, u, extra], axis=1)
        rep = repeated_terms((F.T @ F)[None, None], [f"y+:{n}" for n in names],
                             np.eye(4)[None])
        assert rep["relation"] == relation
    assert line.endswith("the terms x1copy, x1 of x1+ repeat each other in repeat 0's data "
                         "(x1copy - 1 x1 = 0 to round-off over the pooled samples)")


def test_zero_regressors_are_those_of_a_zero_pooled_diagonal():
    from fnsysid.results.metrics import zero_regressors

    H = np.zeros((2, 3, 4, 4))
    H[:, :, 0, 0] = 1.0
    H[0, 2, 1, 1] = 1e-300                  # one client's tiny regressor determines it
    H[1, :, 2, 2] = 2.0
    got = zero_regressors(H)
    assert got.tolist() == [[False, False, True, True], [False, True, False, True]]
    keep = np.array([[True, True, True, False], [True, True, True, True]])
    assert zero_regressors(H, keep).tolist() == [[False, False, True, False],
                                                 [False, True, False, True]]


@pytest.mark.slow
def test_coefficients_no_data_determine_are_said_and_have_no_interval(tmp_path, caplog):
    """Inputs held at 0 (``system.inputs.scale=0``): no data determine the six input
    coefficients, which the pooled least squares leaves at 0 (truths 0.5 to 1). The run said
    status ok, condition number 1.4 (taken without them), no interval for any coefficient and
    a homogeneity test of null p-values beside "rejected: false". Now a warning and
    ``conditioning.undetermined`` name them, ``equations.txt`` says so in its first line, the
    determined coefficients keep their intervals and the test runs on them."""
    from fnsysid.app.experiment import run_experiment
    from tests.conftest import compose_cfg

    caplog.set_level("WARNING", logger="fnsysid")
    out = tmp_path / "run"
    summary = run_experiment(compose_cfg("system=linear", "system.inputs.scale=0",
                                         "strategy=centralized_exact", "M=5", "repeats=2",
                                         "output.plot=false", "progress=false"), out)
    inputs = [f"x{i}+:u{j}" for i in range(3) for j in range(2)]
    assert summary["status"] == "ok"
    assert summary["conditioning"]["undetermined"] == {"terms": inputs, "repeats": [0, 1]}
    said = [r.getMessage() for r in caplog.records if "do not determine" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("the data do not determine 6 coefficient(s) "
                                                 "(x0+:u0, x0+:u1, x1+:u0, x1+:u1, x2+:u0, "
                                                 "x2+:u1, repeat 0 and 1 more repeat(s))")
    assert (out / "equations.txt").read_text().splitlines()[0].endswith(
        "their printed values are no estimate: " + ", ".join(inputs))
    est = pd.read_csv(out / "estimates.csv")
    zero = est["parameter"].isin(inputs)
    assert (est.loc[zero, "estimate"] == 0).all() and est.loc[zero, "se"].isna().all()
    assert (est.loc[~zero, "se"] > 0).all()
    assert summary["ci"]["estimates"].endswith("none for the coefficients the data do not "
                                               "determine (conditioning.undetermined)")
    differ = summary["ci"]["clients_differ"]
    assert differ["support"] == "the determined terms" and None not in differ["pvalue"]
