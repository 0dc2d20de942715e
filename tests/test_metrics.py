"""Held-out scores of a run (precomputed per run) against the straightforward formulas."""

import numpy as np
import pytest

from fnsysid.data.heldout import heldout_from_trajectories
from fnsysid.dynamics import random as rnd
from fnsysid.dynamics.model import group_factor, simulate_blocks, target_groups
from fnsysid.results.metrics import HeldOutScores, ParameterErrors, free_run, one_step
from tests.conftest import make


def _heldout(model, S=2, M=5, J=3, T=6, eps=0.1):
    return heldout_from_trajectories(model, *_trajectories(model, S, M, J, T, eps))


def _trajectories(model, S=2, M=5, J=3, T=6, eps=0.1):
    xs, us = [], []
    for s in range(S):
        _, x, u = simulate_blocks(model, s, [(0, 0, M)], J, T, eps, 0, False, rnd.HOLDOUT)
        xs.append(x)
        us.append(u)
    x, u = np.array(xs), np.array(us)
    mask = np.ones(x.shape[:-1], bool)
    mask[0, 1, 2, 3:] = False                              # a shorter trajectory
    mask[1, 2] = False                                     # a client without held-out data
    return x, u, mask


def _reference(model, theta, ho):
    """NRMSE written out from the predictions, state by state."""
    th = np.broadcast_to(theta, ho.x.shape[:2] + theta.shape[-1:])
    step = one_step(model, th, ho.x, ho.u)                     # (S, M, J, L-1, n_x)
    run = free_run(model, th, ho.x, ho.u)
    pair = ho.mask[..., 1:] & ho.mask[..., :-1]
    out = np.full((2,) + ho.x.shape[:2], np.nan)
    for s, m in np.ndindex(*ho.x.shape[:2]):
        if not ho.mask[s, m].any():
            continue
        for i, (pred, keep, states) in enumerate((
                (step, pair, model.system.target_states),
                (run[..., 1:, :], ho.mask[..., 1:], range(ho.x.shape[-1])))):
            ratios = []
            for k in states:
                if ho.std[s, m, k] > 0:
                    e = (pred[s, m, ..., k] - ho.x[s, m, :, 1:, k])[keep[s, m]]
                    ratios.append(np.sqrt(np.mean(e ** 2)) / ho.std[s, m, k])
            out[i, s, m] = np.mean(ratios)
    return out


@pytest.mark.parametrize("system", ["pendulum", "synthetic", "quadrotor"])
def test_heldout_scores_equal_the_predictions(system):
    _, model, *_ = make(f"system={system}")
    ho = _heldout(model)
    scores = HeldOutScores(model, ho)
    rng = np.random.default_rng(0)
    truth = model.system.nominal @ model.embed
    for m in (1, 5):                                        # shared and per-client models
        theta = truth * (1 + 0.1 * rng.standard_normal((2, m, model.p)))
        ref = _reference(model, theta, ho)
        np.testing.assert_allclose(scores.one_step(theta), ref[0], rtol=1e-12)
        np.testing.assert_allclose(scores.free_run(theta), ref[1], rtol=1e-10)
        assert np.isnan(scores.one_step(theta)[1, 2]) and np.isfinite(ref[0, 0]).all()
        # rolled out for some clients only: theirs as above, NaN for the others
        some = np.arange(ho.x.shape[1]) % 2 == 1
        part = scores.free_run(theta, some)
        np.testing.assert_allclose(part[:, some], ref[1][:, some], rtol=1e-10)
        assert np.isnan(part[:, ~some]).all()


def _residual_nrmse(model, theta, ho):
    """One-step NRMSE from the regression's residuals ``Y - Phi Theta'`` written out."""
    x, u, mask = ho.padded()
    Phi, Y = model.regression(x, u)                            # (S, M, J, L-1, .)
    Th = np.broadcast_to(model.theta_matrix(theta), x.shape[:2] + model.structure.shape[:2])
    res = Y - np.einsum("smjtk,smyk->smjty", Phi, Th)
    keep = mask[..., 1:] & mask[..., :-1]
    out = np.full(x.shape[:2], np.nan)
    for s, m in zip(*np.nonzero(keep.any(axis=(2, 3))), strict=True):
        std = ho.std[s, m, model.system.target_states]
        rmse = np.sqrt(np.mean(res[s, m][keep[s, m]] ** 2, axis=0))
        out[s, m] = np.mean((rmse / std)[std > 0])
    return out


def _perfect(system):
    """A system without disturbance and its nominal model, which then predicts the held-out
    states of clients with the nominal parameters (eps = 0) exactly."""
    over = [f"system={system}", "system.disturbance.kind=zero"]
    if system == "pendulum":            # excite the angle, at rest from the paper's x0 = 0
        over.append("system.x0.scale=[0.5,0.5]")
    _, model, *_ = make(*over)
    return model, _heldout(model, eps=0.0), model.system.nominal @ model.embed


@pytest.mark.parametrize("system", ["pendulum", "synthetic", "linear"])
def test_a_perfect_model_scores_rounding_one_step(system):
    """The one-step residuals of the true model are rounding (~1e-16 of the states): so is its
    NRMSE, shared or per client (the expanded sums of squares gave ~1e-8)."""
    model, ho, truth = _perfect(system)
    scores = HeldOutScores(model, ho)
    for m in (1, 5):
        v = scores.one_step(np.broadcast_to(truth, (2, m, model.p)))
        assert np.isnan(v[1, 2]) and np.isfinite(np.delete(v.ravel(), 7)).all()
        assert np.nanmax(v) < 1e-12


@pytest.mark.parametrize("system", ["pendulum", "synthetic", "quadrotor"])
def test_a_nearly_perfect_model_scores_its_residuals(system):
    """Parameters 1e-9 off the truth: an NRMSE of ~1e-9, below the old 1e-8 floor, equal to the
    residuals written out with numpy up to the residuals' own rounding (~1e-15 of the
    states)."""
    model, ho, truth = _perfect(system)
    scores = HeldOutScores(model, ho)
    rng = np.random.default_rng(4)
    for m in (1, 5):
        theta = truth * (1 + 1e-9 * rng.standard_normal((2, m, model.p)))
        ref = _residual_nrmse(model, theta, ho)
        assert 1e-12 < np.nanmin(ref) and np.nanmax(ref) < 1e-7
        np.testing.assert_allclose(scores.one_step(theta), ref, rtol=1e-5, atol=1e-14)


def test_parameter_errors_match_the_norm_formula():
    rng = np.random.default_rng(1)
    truth = rng.standard_normal((2, 6, 9))
    err = ParameterErrors(truth)
    for est in (rng.standard_normal((2, 1, 9)), rng.standard_normal((2, 6, 9))):
        ref = np.linalg.norm(est - truth, axis=-1) / np.linalg.norm(truth, axis=-1)
        np.testing.assert_allclose(err(est), ref, rtol=1e-14)


@pytest.mark.parametrize("system", ["pendulum", "synthetic", "quadrotor"])
def test_scores_are_evaluated_in_chunks_without_seams(system):
    from fnsysid.results.metrics import CHUNK

    _, model, *_ = make(f"system={system}")
    sys_ = model.system
    rng = np.random.default_rng(2)
    M = CHUNK + 5
    x = rng.standard_normal((1, M, 1, 4, sys_.n_x))
    u = rng.standard_normal((1, M, 1, 3, sys_.n_u))
    ho = heldout_from_trajectories(model, x, u, np.ones(x.shape[:-1], bool))
    scores = HeldOutScores(model, ho)
    theta = (sys_.nominal @ model.embed)[None, None]
    per_client = np.broadcast_to(theta, (1, M, model.p))     # the unchunked per-client path
    np.testing.assert_allclose(scores.one_step(theta), scores.one_step(per_client), rtol=1e-9)
    run = free_run(model, theta, x, u)                       # all clients in one rollout
    rmse = np.sqrt(((run[..., 1:, :] - x[..., 1:, :]) ** 2).mean(axis=(2, 3)))
    np.testing.assert_allclose(scores.free_run(theta), (rmse / ho.std).mean(axis=-1),
                               rtol=1e-10)
    truth = rng.standard_normal((1, M, model.p))
    ref = np.linalg.norm(theta - truth, axis=-1) / np.linalg.norm(truth, axis=-1)
    np.testing.assert_allclose(ParameterErrors(truth)(theta), ref, rtol=1e-14)


def test_heldout_statistics_do_not_depend_on_chunks_or_threads(monkeypatch):
    from fnsysid.dynamics import model as model_mod

    _, model, *_ = make("system=quadrotor")
    rng = np.random.default_rng(3)
    S, M, J, L = 2, 2500, 2, 5
    x = rng.standard_normal((S, M, J, L, model.system.n_x))
    u = rng.standard_normal((S, M, J, L - 1, model.system.n_u))
    mask = np.ones((S, M, J, L), bool)
    mask[0, 7, 1, 3:] = False
    mask[1, 2000] = False
    one = heldout_from_trajectories(model, x, u, mask)          # one chunk per repeat
    monkeypatch.setattr(model_mod, "CHUNK_VALUES", 1)            # one block (1024) a chunk
    monkeypatch.setenv("FNSYSID_THREADS", "2")
    many = heldout_from_trajectories(model, x, u, mask)
    for name in ("gram", "cross", "yy", "n", "std", "factor"):
        np.testing.assert_array_equal(getattr(many, name), getattr(one, name), err_msg=name)
    Phi, Y = model.regression(x[0, 7], u[0, 7])                  # client (0, 7) written out
    keep = (mask[0, 7, :, 1:] & mask[0, 7, :, :-1])
    np.testing.assert_allclose(one.gram[0, 7], np.einsum("ni,nj->ij", Phi[keep], Phi[keep]),
                               rtol=1e-12)
    np.testing.assert_allclose(one.std[0, 7], x[0, 7][mask[0, 7]].std(axis=0), rtol=1e-12)
    # each group's factor: upper triangular with R'R = [Phi_F | Y_J]'[Phi_F | Y_J]
    groups = target_groups(model)
    assert len(groups) == 6                     # the quadrotor's targets use 2 features each
    for g, (F, Js) in enumerate(groups):
        R = group_factor(model, np.moveaxis(one.factor, 1, -1), g)[0, 7]
        A = np.column_stack([Phi[keep][:, F], Y[keep][:, Js]])
        assert R.shape == (len(F) + len(Js),) * 2 and not np.tril(R, -1).any()
        np.testing.assert_allclose(R.T @ R, A.T @ A, rtol=1e-12, atol=1e-12 * (A * A).sum())
    assert one.n[1, 2000] == 0 and one.n[0, 7] == (J * (L - 1) - 2)


def test_round_summaries_equal_the_per_client_arrays(monkeypatch):
    """Many clients and one shared model: train() records maxima and means from one pass
    (shared_summary, here over 4 chunks); keeping the per-client errors takes the array
    path. Same rows."""
    from fnsysid.data.source import load_data
    from fnsysid.learning.start import initial_model
    from fnsysid.results import metrics
    from fnsysid.results.metrics import SMALL
    from fnsysid.runtimes.inprocess import train

    M = SMALL + 1000
    cfg, model, opt, strat = make("system=pendulum", f"M={M}", "N=2", "R=6", "repeats=2",
                                  "output.eval_every=3")
    data = load_data(cfg, model, opt)
    theta0 = initial_model(model, data.train, cfg.system.init)
    monkeypatch.setattr(metrics, "CHUNK", 1000)
    rows = []
    for keep in (False, True):
        hist, diverged = train(strat, data.train, theta0, opt, model, cfg, progress=False,
                               keep_clients=keep, heldout=data.heldout, eval_every=3)
        assert diverged is None
        rows.append({k: np.array(v) for k, v in hist.rows.items()})
    assert (rows[1]["e_max"][-1] < rows[1]["e_max"][0]).all()   # the run moved
    for k, v in rows[1].items():
        np.testing.assert_allclose(rows[0][k], v, rtol=1e-12, err_msg=k)
    np.testing.assert_array_equal(rows[0]["e_max"], rows[1]["e_max"])
    assert np.isnan(rows[0]["nrmse_sim_max"][1]).all()
    assert np.isfinite(rows[0]["nrmse_sim_max"][3]).all()


def test_background_free_run_errors_surface_and_leave_no_thread(monkeypatch):
    """Many clients: the free runs go to a thread of their own, one at a time; an error in
    one reaches train's caller at the next free run, and no thread is left behind."""
    import threading

    from fnsysid.data.source import load_data
    from fnsysid.learning.start import initial_model
    from fnsysid.results.metrics import SMALL
    from fnsysid.runtimes.inprocess import train

    cfg, model, opt, strat = make("system=pendulum", f"M={SMALL}", "N=1", "R=40",
                                  "repeats=1", "output.eval_every=2")
    data = load_data(cfg, model, opt)
    theta0 = initial_model(model, data.train, cfg.system.init)
    calls = []

    def failing(self, theta):
        calls.append(len(calls))
        if len(calls) == 2:
            raise RuntimeError("free run failed")
        return np.zeros(self.valid.shape)

    monkeypatch.setenv("FNSYSID_THREADS", "2")
    monkeypatch.setattr(HeldOutScores, "free_run", failing)
    with pytest.raises(RuntimeError, match="free run failed"):
        train(strat, data.train, theta0, opt, model, cfg, progress=False,
              heldout=data.heldout, eval_every=2)
    assert len(calls) == 2                  # stopped at the next free run, not after R rounds
    for t in threading.enumerate():
        if t.name.startswith("fnsysid-free-run"):
            t.join(timeout=5)
    assert not any(t.name.startswith("fnsysid-free-run") and t.is_alive()
                   for t in threading.enumerate())


def test_row_means_and_coordinate_first_are_numpy_s_bit_for_bit():
    """The per-round shortcuts give np.mean's and np.moveaxis' results exactly (errors.csv
    must not change by a bit)."""
    from fnsysid.results.metrics import _coordinate_first, row_means

    rng = np.random.default_rng(11)
    for S, M in ((1, 1), (5, 20), (3, 1000), (2, 4097)):
        v = rng.random((S, M)) * 10.0 ** rng.uniform(-8, 8, size=(S, 1))
        for a in (v, np.asfortranarray(v)):
            assert row_means(a).tobytes() == a.mean(axis=1).tobytes()
        est = rng.random((S, 1, 3))
        moved = _coordinate_first(est)
        assert moved.shape == (3, S, 1) and (moved == np.moveaxis(est, -1, 0)).all()



def test_a_state_held_at_a_value_is_constant_not_a_scale_of_1e_17():
    """A client whose held-out state is 0.3 at every sample: its standard deviation is the
    rounding of its mean (5e-17 with the two-pass formula on a fleet's CSV), which made its
    NRMSE 1e14 and the fleet's mean 5e12 beside status ok. It is constant: left out (NaN)
    like an exact 0, and the other clients' scores are unchanged."""
    _, model, *_ = make("system=linear")
    x, u, mask = _trajectories(model)
    ho = heldout_from_trajectories(model, x, u, mask)
    x = x.copy()
    x[0, 0] = 0.3                                       # client 0 of repeat 0 held at 0.3
    held = heldout_from_trajectories(model, x, u, mask)
    assert (held.std[0, 0] == 0).all() and (held.std[0, 1:] > 0).all()
    theta = np.broadcast_to(model.system.nominal @ model.embed, (2, 1, model.p)) * 1.01
    v = HeldOutScores(model, held).one_step(theta)
    ref = HeldOutScores(model, ho).one_step(theta)
    assert np.isnan(v[0, 0]) and np.isfinite(ref[0, 0])
    np.testing.assert_allclose(v[0, 1:], ref[0, 1:])
    np.testing.assert_allclose(v[1], ref[1])
