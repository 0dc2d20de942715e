"""Client-level differential privacy (privacy=central / local, fnsysid/learning/privacy.py):
the accounting against dp-accounting itself and the Gaussian closed form, the noise's size
against the noise multiplier, clipping and the eigenvalue repair against direct computations,
and the settings refused before a run."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from fnsysid.app.experiment import execute
from fnsysid.config.errors import ConfigError
from fnsysid.dynamics.model import least_squares
from fnsysid.learning import privacy as pv
from tests.conftest import compose_cfg

#: dp-accounting (the privacy extra, in the dev extra) is imported by the tests that run it,
#: not when the tests are collected (it imports scipy: a second per test worker)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("dp_accounting") is None,
                                reason="dp-accounting is not installed (the privacy extra)")


@pytest.fixture(scope="module")
def dpa():
    import dp_accounting

    return dp_accounting

SMALL = ("system=synthetic", "eps=0", "M=40", "repeats=2", "data.val_N=0", "output.plot=false")


def run(*overrides):
    return execute(compose_cfg(*SMALL, *overrides), choices={})


@pytest.mark.slow
def test_reported_epsilon_is_the_accountants_for_the_reported_noise(dpa):
    """epsilon=1, delta=1e-5 (one release): the noise multiplier solved for it spends at most
    epsilon by dp-accounting's PLD accountant run here from the reported numbers, and as
    much to 1e-3 (the smallest noise that meets it); the analytic Gaussian mechanism (Balle
    and Wang 2018, dp_accounting.get_epsilon_gaussian) agrees."""
    s = run("strategy=centralized_exact", "privacy=central").summary["privacy"]
    assert (s["mode"], s["rounds"], s["sampling_rate"], s["clip"]) == ("central", 1, 1.0, 300.0)
    assert s["accountant"] == "dp_accounting PLD (value_discretization_interval=0.001)"
    acc = dpa.pld.PLDAccountant(value_discretization_interval=1e-3)
    acc.compose(dpa.GaussianDpEvent(s["noise_multiplier"]))
    eps = acc.get_epsilon(s["delta"])
    assert eps <= 1.0 and eps == pytest.approx(1.0, abs=2e-3)
    assert s["epsilon"] == pytest.approx(eps, rel=1e-12)
    fine = dpa.pld.PLDAccountant()              # at its default discretization
    fine.compose(dpa.GaussianDpEvent(s["noise_multiplier"]))
    assert fine.get_epsilon(s["delta"]) <= 1.0
    assert dpa.get_epsilon_gaussian(s["noise_multiplier"], 1e-5) == pytest.approx(1.0, abs=2e-3)
    assert 3.6 < s["noise_multiplier"] < 3.9          # sigma of the Gaussian mechanism at (1, 1e-5)


@pytest.mark.slow
def test_given_noise_multiplier_reports_its_epsilon_by_rdp(caplog, dpa):
    s = run("strategy=oneshot", "privacy=central", "privacy.delta=0.05").summary["privacy"]
    assert "is at least 1/M (M=40 clients)" in caplog.text and s["delta"] == 0.05
    s = run("strategy=oneshot", "privacy=central", "privacy.epsilon=null",
            "privacy.noise_multiplier=2.0", "privacy.accountant=rdp").summary["privacy"]
    acc = dpa.rdp.RdpAccountant(orders=pv.RDP_ORDERS)
    acc.compose(dpa.GaussianDpEvent(2.0))
    assert s["noise_multiplier"] == 2.0
    assert s["epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-12)
    # RDP is an upper bound of the exact (analytic) epsilon of the Gaussian mechanism
    assert s["epsilon"] >= dpa.get_epsilon_gaussian(2.0, 1e-5)


def test_noise_size_matches_the_noise_multiplier():
    """Two noise seeds on the same clipped statistics differ by N(0, 2 sigma^2) on the
    diagonal of H and on b, N(0, sigma^2) off the diagonal (symmetric noise of variance
    sigma^2 / 2 there), sigma = z clip; the variance estimates of 400 repeats within 12 %."""
    rng = np.random.default_rng(0)
    S, M, p = 400, 5, 4
    X = rng.standard_normal((S, M, 30, p))
    H = np.einsum("smtp,smtq->smpq", X, X)
    b = np.einsum("smtp,smt->smp", X, rng.standard_normal((S, M, 30)))
    priv = pv.Privacy("central", clip=10.0, delta=1e-5, noise_multiplier=3.0)
    H1, b1, sigma = pv.private_statistics(priv, H, b, seed=1)
    H2, b2, _ = pv.private_statistics(priv, H, b, seed=2)
    assert np.allclose(sigma, 30.0)
    dH, db = H1 - H2, b1 - b2
    assert np.array_equal(dH, np.swapaxes(dH, -1, -2))
    iu = np.triu_indices(p, 1)
    assert np.var(np.diagonal(dH, axis1=1, axis2=2)) / (2 * 900) == pytest.approx(1, abs=0.12)
    assert np.var(dH[:, iu[0], iu[1]]) / 900 == pytest.approx(1, abs=0.12)
    assert np.var(db) / (2 * 900) == pytest.approx(1, abs=0.12)
    # centred on the clipped sum: mean of the 2 S draws within 4 standard errors
    f = np.minimum(1, 10.0 / np.sqrt((H ** 2).sum((-1, -2)) + (b ** 2).sum(-1)))
    assert (f < 1).all() and priv.clipped_fraction == 1.0
    mean_err = ((H1 + H2) / 2 - np.einsum("sm,smpq->spq", f, H)).mean(axis=0)
    assert np.abs(mean_err).max() < 4 * 30 / np.sqrt(2 * S)
    # a run's noise: two noise seeds (same data) differ, by the same law, in the estimate
    assert not np.allclose(b1, b2)


def test_local_noise_has_the_variance_of_every_clients_own():
    priv = pv.Privacy("local", clip=2.0, delta=1e-5, noise_multiplier=1.5)
    # each of M clients adds N(0, (z 2 clip)^2): the sum has M times that variance
    assert np.allclose(priv.sigma(2.0, np.array([1, 100])), [1.5 * 4, 1.5 * 4 * 10])
    central = pv.Privacy("central", clip=2.0, delta=1e-5, noise_multiplier=1.5)
    assert np.allclose(central.sigma(2.0, np.array([1, 100])), [3.0, 3.0])


def test_clipping_scales_each_client_jointly():
    """With (almost) no noise the released sums are sum_i min(1, C / ||(H_i, b_i)||) (H_i,
    b_i), computed here client by client."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((2, 6, 10, 3))
    H = np.einsum("smtp,smtq->smpq", X, X)
    b = rng.standard_normal((2, 6, 3)) * np.arange(1, 7)[None, :, None] * 8
    priv = pv.Privacy("central", clip=40.0, delta=1e-5, noise_multiplier=1e-12)
    Hs, bs, _ = pv.private_statistics(priv, H, b, seed=0)
    Hw, bw = np.zeros((2, 3, 3)), np.zeros((2, 3))
    clipped = 0
    for s in range(2):
        for m in range(6):
            norm = np.sqrt(np.sum(H[s, m] ** 2) + np.sum(b[s, m] ** 2))
            f = min(1.0, 40.0 / norm)
            clipped += norm > 40.0
            Hw[s] += f * H[s, m]
            bw[s] += f * b[s, m]
    assert np.allclose(Hs, Hw, atol=1e-9) and np.allclose(bs, bw, atol=1e-9)
    assert priv.clipped_fraction == pytest.approx(clipped / 12) and 0 < clipped < 12


def test_eigenvalue_repair():
    """Eigenvalues below the floor are raised to it (a direct solve with the repaired
    matrix); above it the solve is H^-1 b."""
    Q = np.linalg.qr(np.random.default_rng(2).standard_normal((3, 3)))[0]
    H = Q @ np.diag([-2.0, 0.5, 4.0]) @ Q.T
    b = np.array([1.0, -1.0, 2.0])
    got = pv.repaired_solve(H[None], b[None], np.array([1.0]))[0]
    assert np.allclose(got, np.linalg.solve(Q @ np.diag([1.0, 1.0, 4.0]) @ Q.T, b), atol=1e-12)
    got = pv.repaired_solve(H[None] + 3 * np.eye(3), b[None], np.array([0.5]))[0]
    assert np.allclose(got, np.linalg.solve(H + 3 * np.eye(3), b), atol=1e-12)
    assert pv.eigen_floor(8, np.array([2.0]))[0] == pytest.approx(8.0)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["centralized_exact", "oneshot"])
def test_without_noise_or_clipping_the_private_run_is_the_plain_one(strategy):
    """clip far above every contribution and noise multiplier 0: the private estimate is the
    non-private one to 1e-10 (clipping, noise and repair change nothing else); epsilon is
    null (infinite)."""
    plain = run(f"strategy={strategy}")
    priv = run(f"strategy={strategy}", "privacy=central", "privacy.clip=1e9",
               "privacy.epsilon=null", "privacy.noise_multiplier=0")
    assert priv.summary["privacy"]["clipped_fraction"] == 0.0
    assert priv.summary["privacy"]["epsilon"] is None
    assert np.allclose(priv.estimate, plain.estimate, rtol=0, atol=1e-10)
    assert priv.summary["status"] == "ok"


@pytest.mark.slow
def test_private_estimate_is_noisy_and_converges():
    """The default (epsilon 1) moves the estimate away from the plain one, by about 1/M (the
    noise is fixed, the statistics grow with M): over 4 times less at 10 times the clients."""
    gaps = []
    for M in (400, 4000):
        plain = execute(compose_cfg(*SMALL, f"M={M}", "strategy=centralized_exact"), choices={})
        priv = execute(compose_cfg(*SMALL, f"M={M}", "strategy=centralized_exact",
                                   "privacy=central"), choices={})
        gaps.append(np.linalg.norm(priv.estimate - plain.estimate))
        assert priv.tables.get("estimates") is not None
    assert gaps[0] > 1e-2 and gaps[1] < gaps[0] / 4


def test_oneshot_private_mean_matches_closed_form():
    """With no noise, the private mean is the mean over the present clients of their own
    estimates clipped to norm C."""
    rng = np.random.default_rng(3)
    theta = rng.standard_normal((2, 8, 3)) * 2
    present = np.ones((2, 8), bool)
    present[1, 3] = False
    priv = pv.Privacy("central", clip=2.5, delta=1e-5, noise_multiplier=1e-12)
    got = pv.private_mean(priv, theta, present, seed=0)
    n = np.linalg.norm(theta, axis=-1, keepdims=True)
    clipped = theta * np.minimum(1, 2.5 / n)
    want = [clipped[0].mean(0), np.delete(clipped[1], 3, axis=0).mean(0)]
    assert np.allclose(got, want, atol=1e-9)
    assert np.allclose(least_squares(np.eye(2)[None], np.ones((1, 2))), 1.0)


@pytest.mark.parametrize("extra, words", [
    (("strategy=scaffold", "privacy=central"), "allowed: strategy=centralized_exact, oneshot"),
    (("strategy=fedlin", "privacy=central"), "fedavg, fedprox or fednova"),
    (("strategy=oneshot", "strategy.weighting=samples", "privacy=central"),
     "strategy.weighting=uniform"),
    (("strategy=oneshot", "privacy=central", "privacy.noise_multiplier=2"), "exactly one"),
    (("strategy=oneshot", "privacy=central", "privacy.epsilon=null"), "exactly one"),
    (("strategy=oneshot", "privacy=local", "privacy.epsilon=1e-7"), "cannot be met"),
    (("strategy=oneshot", "privacy=local", "privacy.epsilon=null",
      "privacy.noise_multiplier=0.1"), "0 (no noise, no privacy)"),
    (("strategy=oneshot", "privacy=central", "sparsity=stlsq"), "sparsity=none"),
    (("strategy=oneshot", "privacy=central", "personalize=auto"), "personalize=none"),
])
def test_settings_that_cannot_be_met_are_refused_in_one_line(extra, words):
    with pytest.raises(ConfigError) as err:
        run(*extra)
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("extra", ["privacy.delta=2", "privacy.clip=-1", "privacy.accountant=x",
                                   "privacy.epsilon=0"])
def test_out_of_range_settings_are_refused(extra):
    with pytest.raises(ConfigError) as err:
        run("strategy=oneshot", "privacy=central", extra)
    assert extra.split("=")[0] in str(err.value) and "\n" not in str(err.value)


def test_without_the_extra_privacy_is_refused_with_the_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "dp_accounting", None)        # import fails
    with pytest.raises(ConfigError) as err:
        run("strategy=oneshot", "privacy=central")
    assert "pip install -e '.[privacy]'" in str(err.value) and "\n" not in str(err.value)
    run("strategy=oneshot")                  # privacy=none needs nothing


def test_noise_projection_onto_the_statistics_space():
    """For a dense model (H = I (x) F) the projection of symmetric noise is I (x) the mean of
    its diagonal blocks (closed form); real statistics are left as they are (so the
    projection is post-processing); b of a dense model spans all of R^p."""
    from fnsysid.dynamics.systems import dense_structure

    n_y, n_phi = 3, 4
    UH, Ub = pv.statistics_bases(dense_structure(n_y, n_phi))
    assert UH.shape == (144, 16) and Ub.shape == (12, 12)
    g = np.random.default_rng(4).standard_normal((2, 12, 12))
    E = g + np.swapaxes(g, -1, -2)
    blocks = np.mean([E[:, j * 4:(j + 1) * 4, j * 4:(j + 1) * 4] for j in range(n_y)], axis=0)
    want = np.einsum("jk,spq->sjpkq", np.eye(n_y), blocks).reshape(2, 12, 12)
    assert np.allclose(pv.project(E, UH), want, atol=1e-12)
    X = np.random.default_rng(5).standard_normal((2, 20, n_phi))
    H = np.einsum("jk,stp,stq->sjpkq", np.eye(n_y), X, X).reshape(2, 12, 12)
    assert np.allclose(pv.project(H, UH), H, atol=1e-10)


# --- DP-FedAvg (round-based strategies) ------------------------------------------------------

ROUNDS = ("R=30", "K=5", "lr=1e-3")


@pytest.mark.parametrize("strategy", ["fedavg", "fedprox", "fednova"])
def test_dp_fedavg_without_noise_or_clipping_is_the_plain_round(strategy):
    """clip far above every change, noise 0, every client: the step-by-step private rounds
    (server + mean of the changes) equal the plain rounds (FedAvg's precomputed server map)
    to 1e-10, every round."""
    plain = run(f"strategy={strategy}", *ROUNDS)
    priv = run(f"strategy={strategy}", *ROUNDS, "privacy=central", "privacy.clip=1e9",
               "privacy.epsilon=null", "privacy.noise_multiplier=0")
    assert np.allclose(priv.estimate, plain.estimate, rtol=0, atol=1e-10)
    assert np.allclose(priv.errors["e_max"], plain.errors["e_max"], rtol=0, atol=1e-10)


@pytest.mark.slow
def test_dp_fedavg_accounting_over_sampled_rounds(dpa):
    """fraction 0.25 and 30 rounds: the reported epsilon is dp-accounting's PLD epsilon of
    30 Poisson-sampled Gaussian rounds with the reported noise multiplier (recomputed here),
    at most the target; errors.csv's epsilon_rdp grows round by round to RDP's epsilon of
    the same 30 rounds, an upper bound of PLD's."""
    res = run("strategy=fedavg", *ROUNDS, "strategy.fraction=0.25", "privacy=central",
              "privacy.epsilon=8", "privacy.clip=0.5")
    s = res.summary["privacy"]
    assert (s["rounds"], s["sampling_rate"]) == (30, 0.25)
    event = dpa.SelfComposedDpEvent(
        dpa.PoissonSampledDpEvent(0.25, dpa.GaussianDpEvent(s["noise_multiplier"])), 30)
    pld = dpa.pld.PLDAccountant(value_discretization_interval=1e-3)
    pld.compose(event)
    eps = pld.get_epsilon(1e-5)
    assert s["epsilon"] == pytest.approx(eps, rel=1e-9) and eps <= 8.0
    assert eps == pytest.approx(8.0, rel=0.01)
    rdp = dpa.rdp.RdpAccountant(orders=pv.RDP_ORDERS)
    rdp.compose(event)
    col = res.errors.loc[res.errors["repeat"] == 0, "epsilon_rdp"].to_numpy()
    assert col[0] == 0 and np.all(np.diff(col) > 0)
    assert col[-1] == pytest.approx(rdp.get_epsilon(1e-5), rel=1e-9) and col[-1] >= eps


@pytest.mark.slow
def test_local_privacy_counts_every_round_whatever_the_participation(dpa):
    """privacy=local with fraction 0.25: the server sees who sends, so sampling amplifies
    nothing: the epsilon is PLD's of 30 unsampled Gaussian releases (it was that of 30
    Poisson-sampled ones, about 4 times too small where a client is sampled at 0.1)."""
    res = run("strategy=fedavg", *ROUNDS, "strategy.fraction=0.25", "privacy=local",
              "privacy.epsilon=8", "privacy.clip=0.5")
    s = res.summary["privacy"]
    assert (s["rounds"], s["sampling_rate"], s["participation"]) == (30, 1.0, 0.25)
    pld = dpa.pld.PLDAccountant(value_discretization_interval=1e-3)
    pld.compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(s["noise_multiplier"]), 30))
    assert s["epsilon"] == pytest.approx(pld.get_epsilon(1e-5), rel=1e-9)
    assert s["epsilon"] == pytest.approx(8.0, rel=0.01)
    sampled = dpa.pld.PLDAccountant(value_discretization_interval=1e-3)
    sampled.compose(dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(
        0.25, dpa.GaussianDpEvent(s["noise_multiplier"])), 30))
    assert sampled.get_epsilon(1e-5) < 0.5 * s["epsilon"]       # what was reported before


def test_private_change_clips_samples_and_adds_the_predicted_noise():
    rng = np.random.default_rng(6)
    change = rng.standard_normal((300, 10, 3))
    active = rng.random((300, 10)) < 0.5
    quiet = pv.Privacy("central", clip=1.0, delta=1e-5, noise_multiplier=0.0)
    got = pv.private_change(quiet, change, active, seed=0, r=1, expected=5.0)
    n = np.linalg.norm(change, axis=-1, keepdims=True)
    want = (change * np.minimum(1, 1.0 / n) * active[..., None]).sum(axis=1) / 5.0
    assert np.allclose(got, want, atol=1e-12)
    noisy = pv.Privacy("central", clip=1.0, delta=1e-5, noise_multiplier=2.0)
    a = pv.private_change(noisy, change, active, seed=0, r=1, expected=5.0)
    b = pv.private_change(noisy, change, active, seed=1, r=1, expected=5.0)
    # two seeds: difference N(0, 2 (z C / expected)^2) per coordinate
    assert np.var(a - b) / (2 * (2.0 / 5.0) ** 2) == pytest.approx(1, abs=0.12)
    assert not np.allclose(pv.private_change(noisy, change, active, 0, 2, 5.0), a)


@pytest.mark.slow
def test_dp_participation_is_poisson_sampling():
    from tests.conftest import make

    settings, model, optimizer, strategy = make(*SMALL, "strategy=fedavg", "R=20",
                                                "strategy.fraction=0.3", "privacy=central")
    strategy.server, strategy.n_clients, strategy.seed = np.zeros((2, 15)), 1000, 0
    masks = np.array([strategy.participants(r) for r in range(1, 21)])
    counts = masks.sum(axis=-1)
    assert len(np.unique(counts)) > 5                 # not a fixed number a round
    assert counts.mean() / 300 == pytest.approx(1, abs=0.03)


@pytest.mark.slow
def test_noise_multiplier_is_solved_once_for_the_same_target():
    """The pre-run check and the run plan the same mechanism: the second solve is the
    cached first (same number), and a different target is solved anew."""
    from fnsysid.learning.privacy import solve_noise_multiplier

    first = solve_noise_multiplier(0.7, 1e-5, 3, 0.5, "pld")
    hits = solve_noise_multiplier.cache_info().hits
    assert solve_noise_multiplier(0.7, 1e-5, 3, 0.5, "pld") == first
    assert solve_noise_multiplier.cache_info().hits == hits + 1
    assert solve_noise_multiplier(1.4, 1e-5, 3, 0.5, "pld") < first


def test_the_noise_share_of_a_release_is_its_noise_energy_over_the_released_one():
    """``Privacy.released``: sigma^2 d / ||value||^2 (at most 1), the largest over repeats and
    releases; a release of pure noise gives about 1, a sum far above its noise about 0."""
    priv = pv.Privacy("central", clip=1.0, delta=1e-5, noise_multiplier=1.0)
    priv.released(np.array([[30.0, 40.0]]), np.array([1.0]), 2)
    assert priv.noise_share == pytest.approx(2 / 2500)
    priv.released(np.array([[3.0, 4.0], [300.0, 400.0]]), np.array([2.0, 2.0]), 2)
    assert priv.noise_share == pytest.approx(8 / 25)                  # the worst repeat
    priv.released(np.array([[3.0, 4.0]]), np.array([5.0]), 2)
    assert priv.noise_share == 1.0                                    # capped
    quiet = pv.Privacy("central", clip=1.0, delta=1e-5, noise_multiplier=0.0)
    quiet.released(np.zeros((1, 2)), np.array([0.0]), 2)
    assert quiet.noise_share == 0.0                                   # no noise, nothing
    # DP-FedAvg: one round's noise (round_noise_sd per coefficient) over the final model
    rounds = pv.Privacy("central", clip=1.0, delta=1e-5, noise_multiplier=1.0)
    rounds.model_share(np.array([[[3.0, 4.0]]]))
    assert rounds.noise_share is None                                 # not round-based
    rounds.round_noise_sd = 0.5
    rounds.model_share(np.array([[[np.inf, 4.0]]]))
    assert rounds.noise_share is None                                 # a diverged model
    rounds.model_share(np.array([[[3.0, 4.0]]]))
    assert rounds.noise_share == pytest.approx(0.25 * 2 / 25)
    assert rounds.moved == pytest.approx(0.5 * np.sqrt(2) / 5) and rounds.moved_by == "round_noise"
    assert rounds.summary()["noise_share_of"] == pv.FINAL_MODEL
    rng = np.random.default_rng(0)
    pure = pv.Privacy("central", clip=1.0, delta=1e-5, noise_multiplier=1.0)
    pure.released(3.0 * rng.standard_normal((1, 4000)), np.array([3.0]), 4000)
    assert pure.noise_share == pytest.approx(1.0, abs=0.05)
    # the symmetric noise's energy after the projection of private_statistics
    U, _ = pv.statistics_bases(np.stack([np.eye(3), np.eye(3)])[:, :, [0, 1, 2]])
    assert pv.symmetric_dims(U) == pytest.approx(
        np.mean([np.sum(pv.project(0.5 * (g + g.T)[None], U) ** 2) for g in
                 rng.standard_normal((4000, 3, 3))]), rel=0.05)


@pytest.mark.slow
def test_an_estimate_that_privacy_moved_is_said_and_the_lr_advice_names_the_noise(caplog):
    """``privacy.moved``: how far clipping and noise moved the estimate from the same
    estimator (or the same rounds) on the exact contributions, which tracks the error privacy
    adds where the share of the sums' energy does not (a coefficient the data determine
    loosely takes the sums' noise through the inverse Gram matrix). At M = 20 the default
    budget (epsilon 1) moves oneshot's estimate by more than its norm and
    centralized_exact's by about 1, which a warning, the free-run line and ``fnsysid show``
    say (and the mean-of-own-fits check, which ignores the noise, is not run). The
    pendulum's statistics at M = 20000 with clip 0.2 are 0.09 % noise by energy, yet the
    estimate moves by 0.38 (two repeats; over five its coefficient A, truth 2, comes out
    between -19.4 and 17.0): said too. At M = 5000 the synthetic statistics move it by about
    0.01: nothing is said. DP-FedAvg diverges at round 1: its model takes noise of std
    z C / M every round, and the advice names that instead of only a smaller lr; with clip
    0.1 it ends, and the same rounds without privacy put its final model about its error
    away (e_R 2.5 against 0.07 without privacy). Clipping alone (no noise) is named as such,
    with a larger clip as the advice."""
    from fnsysid.app.cli import divergence_line
    from fnsysid.results.equations import _privacy_line
    from fnsysid.results.modelcheck import free_run_warning

    caplog.set_level("WARNING", logger="fnsysid")
    base = ("system=synthetic", "repeats=2", "output.plot=false", "privacy=central")
    one = execute(compose_cfg(*base, "strategy=oneshot"), choices={}).summary
    assert one["status"] == "ok" and one["privacy"]["moved"] > 1
    assert one["privacy"]["noise_share"] > 0.99
    assert "own_precision" not in one.get("conditioning", {})
    said = [m.getMessage() for m in caplog.records]
    assert any(m.startswith("privacy: clipping and noise moved the estimate by") and
               "makes up 100%" in m for m in said)
    line, warn = free_run_warning(one)
    assert warn and "(privacy.moved" in line and "not the library" in line
    assert "moved the estimate by" in _privacy_line(one["privacy"])
    exact = execute(compose_cfg(*base, "strategy=centralized_exact"), choices={}).summary
    assert exact["privacy"]["moved"] > 0.5 and exact["final_e_mean_mean"] > 0.5
    caplog.clear()
    pend = execute(compose_cfg("system=pendulum", "strategy=centralized_exact", "M=20000",
                               "repeats=2", "output.plot=false", "privacy=central",
                               "privacy.clip=0.2"), choices={}).summary
    assert pend["privacy"]["noise_share"] < 0.01 and 0.1 < pend["privacy"]["moved"] < 1
    assert any(m.getMessage().startswith("privacy: clipping and noise moved the estimate by")
               for m in caplog.records)
    caplog.clear()
    many = execute(compose_cfg(*base, "strategy=centralized_exact", "M=5000"),
                   choices={}).summary
    assert many["privacy"]["moved"] < 0.05 and many["final_e_mean_mean"] < 0.05
    assert not any(m.getMessage().startswith("privacy:") for m in caplog.records)
    assert "moved" not in _privacy_line(many["privacy"])
    avg = execute(compose_cfg(*base, "strategy=fedavg"), choices={}).summary
    z, C = avg["privacy"]["noise_multiplier"], avg["privacy"]["clip"]
    assert avg["status"] == "diverged" and avg["privacy"]["moved"] is None
    assert avg["privacy"]["round_noise_sd"] == pytest.approx(z * C / 20)
    advice = divergence_line(avg, 1e-4)
    assert "which a smaller lr does not shrink" in advice and f"{z * C / 20:.3g}" in advice
    caplog.clear()
    clipped = execute(compose_cfg(*base, "strategy=fedavg", "privacy.clip=0.1"),
                      choices={}).summary
    assert clipped["status"] == "ok" and clipped["final_e_mean_mean"] > 1
    sd = clipped["privacy"]["round_noise_sd"]
    assert sd == pytest.approx(clipped["privacy"]["noise_multiplier"] * 0.1 / 20)
    # the same rounds without clipping or noise: the final model moved by about its error
    assert clipped["privacy"]["moved_by"] == "rounds"
    assert clipped["privacy"]["moved"] == pytest.approx(clipped["final_e_mean_mean"], rel=0.3)
    assert any(m.getMessage().startswith("privacy: clipping and noise moved the final model")
               for m in caplog.records)
    # clipping alone (no noise) moves oneshot's estimate: the advice is a larger clip
    clip_only = execute(compose_cfg(*base, "strategy=oneshot", "M=400", "N=1", "T=6",
                                    "privacy.clip=5", "privacy.epsilon=null",
                                    "privacy.noise_multiplier=0"), choices={}).summary
    priv = clip_only["privacy"]
    assert priv["moved"] == pytest.approx(priv["clip_moved"]) and priv["moved"] > 0.1
    assert "it is clipping" in pv.moved_line(priv) and "no noise" in pv.moved_line(priv)
    assert "epsilon" not in pv.moved_line(priv)
    # DP-FedNova with local noise: the warning gives the local noise's size
    nova = execute(compose_cfg("system=pendulum", "strategy=fednova", "M=2", "N=2", "T=3",
                               "R=3", "repeats=1", "eps=0", "K=1", "privacy=local",
                               "privacy.epsilon=null", "privacy.noise_multiplier=1.0",
                               "output.plot=false"), choices={}).summary
    assert nova["privacy"]["round_noise_sd"] == pytest.approx(300 * 2 * np.sqrt(2) / 2)
    assert nova["privacy"]["moved"] > 0.5 and nova["privacy"]["moved_by"] == "rounds"
    line = pv.moved_line(nova["privacy"])
    assert "2 sqrt(M) privacy.clip" in line and "above every contribution" in line
    # clipping every change to 1e-3 at M = 2000: the rounds' noise added up (at most 3e-4 of
    # the model) cannot have moved it by 0.39: the move is clipping's
    tiny = execute(compose_cfg(*base, "strategy=fedavg", "M=2000", "R=50", "repeats=1",
                               "privacy.clip=1e-3"), choices={}).summary["privacy"]
    assert tiny["moved_by"] == "rounds" and tiny["moved"] > 0.3 and tiny["noise_bound"] < 1e-3
    assert "most of it is clipping" in pv.moved_line(tiny)
    # a closed form under local noise names the local noise's size
    local = execute(compose_cfg(*base[:-1], "privacy=local", "strategy=centralized_exact",
                                "M=5000"), choices={}).summary
    assert "2 sqrt(M) privacy.clip" in pv.moved_line(local["privacy"])


@pytest.mark.slow
def test_the_plain_rounds_are_not_run_where_they_would_not_compare(monkeypatch):
    """DP-FedAvg's ``privacy.moved`` re-runs the rounds without clipping or noise (DP-FedAvg's
    own rounds with an unbounded clip and no noise, so the same clients take part: with
    clients sampled, no clipping and no noise the move is 0), except where they diverge and
    the private ones do not (clipping kept the run bounded: said, not measured; pendulum,
    lr 3, clip 3, no noise), and where the run is interrupted (Ctrl-C must not start a
    second run)."""
    from fnsysid.runtimes import interrupt

    base = ("system=pendulum", "M=20", "strategy=fedavg", "output.plot=false",
            "privacy=central", "privacy.epsilon=null", "privacy.noise_multiplier=0")
    bounded = execute(compose_cfg(*base, "lr=3", "privacy.clip=3"), choices={}).summary
    assert bounded["status"] == "ok" and bounded["final_e_mean_mean"] < 0.1
    assert bounded["privacy"]["plain_diverged"] is True
    assert bounded["privacy"]["moved"] is None and pv.moved_line(bounded["privacy"]) is None
    sampled = execute(compose_cfg(*base, "strategy.fraction=0.1", "privacy.clip=1e9"),
                      choices={}).summary
    assert sampled["privacy"]["moved_by"] == "rounds" and sampled["privacy"]["moved"] < 1e-12
    same = execute(compose_cfg(*base, "privacy.clip=1e9"), choices={}).summary
    assert same["privacy"]["moved_by"] == "rounds" and same["privacy"]["moved"] < 1e-12
    monkeypatch.setattr(interrupt, "requested", lambda: 2)
    stopped = execute(compose_cfg(*base, "privacy.clip=1e9"), choices={}).summary
    assert stopped["status"] == "interrupted" and stopped["privacy"]["moved_by"] != "rounds"


def test_the_noise_bound_of_rounds_is_against_the_plain_model():
    """``noise_bound`` (what the rounds' noise added up could move the model, at most about)
    is against the plain rounds' model, not the private one the noise inflated: with the
    private model 100 times the plain one it is still sd sqrt(p R) / ||plain||; the
    advice then does not call a noisy move clipping."""
    plain = np.array([[[3.0, 4.0]]])
    for sd, clipping in ((0.5, True), (50.0, False)):
        priv = pv.Privacy("central", clip=1.0, delta=1e-5, noise_multiplier=1.0)
        priv.rounds, priv.round_noise_sd, priv.clipped_fraction = 16, sd, 0.3
        priv.compare(100 * plain, plain, by="rounds")
        priv.model_share(100 * plain)          # the private model: does not replace it
        assert priv.noise_bound == pytest.approx(sd * np.sqrt(2 * 16) / 5)
        assert priv.moved == pytest.approx(99)
        line = pv.moved_line(priv.summary())
        # a bound of 0.57 cannot explain a move of 99 (clipping); one of 57 can (the noise)
        assert ("most of it is clipping" in line) == clipping
        assert ("not told apart" in line) != clipping
