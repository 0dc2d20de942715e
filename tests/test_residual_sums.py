"""Training residual sums from each client's QR factors (``ClientData.factor``): the model
check's training noise and Theorem 1's ``sigma_w`` against residuals written out in extended
precision, on data whose targets are far larger than their residuals (where the expanded
``yy - 2 theta'b + theta'H theta`` loses every digit)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fnsysid.app.build import build
from fnsysid.dynamics.model import (
    ClientData,
    least_squares,
    ragged_stats,
    residual_sums,
    sample_stats,
)
from fnsysid.learning.ownfit_stats import own_fits, training_noise
from fnsysid.results.theory import theorem1_table
from tests.conftest import compose_cfg

M, N = 4, 200


def generic_model():
    """x1+ and x2+ on the features (x1, x2, u): two targets sharing three features."""
    return build(compose_cfg("system=generic", "data=files", "data.path=x",
                             "data.states=[x1,x2]", "data.inputs=[u]"))[0]


def offset_data(model, noise: float, offset: float = 1e4, seed: int = 3):
    """M clients of N samples whose features sit at ``offset`` (targets ~ offset) with
    residuals of size ``noise``; returns the statistics and the samples."""
    rng = np.random.default_rng(seed)
    Phi = offset + rng.normal(size=(M * N, 3))
    Y = Phi @ rng.normal(size=(3, 2)) + noise * rng.normal(size=(M * N, 2))
    stats = [a[None] for a in ragged_stats(model, Phi, Y, np.full(M, N))]
    data = ClientData(np.full((1, M, model.p), np.nan), *stats[:4], None, None, None, *stats[4:])
    return data, Phi, Y


def exact_rss(Phi, Y, Th):
    """Each client's residual sum of squares per target (M, n_y) of ``Th`` (M or 1, n_y,
    n_phi), computed from the samples in extended precision."""
    P = Phi.reshape(M, N, -1).astype(np.longdouble)
    r = Y.reshape(M, N, -1).astype(np.longdouble) - P @ np.swapaxes(Th, -1, -2).astype(
        np.longdouble)
    return (r * r).sum(axis=1).astype(float)


@pytest.mark.parametrize("noise, rtol", [(0.1, 1e-10), (1e-6, 1e-5)])
def test_training_noise_equals_the_residuals_of_the_samples(noise, rtol):
    """Offset 1e4: residuals of 0.1 are 1e-5 of the targets, the expanded form is ~1e-5 off
    and the factors' 1e-11; residuals of 1e-6 are 1e-10 of the targets: the expanded form
    is off by more than 100 % (its rounding, 1e-16 of yy, exceeds the residuals), the
    factors' by ~3e-6, the rounding of residuals computed from values of 1e4."""
    model = generic_model()
    data, Phi, Y = offset_data(model, noise)
    theta = own_fits(data)
    s2, dof = training_noise(model, data, theta)
    assert np.array_equal(dof[0], np.full((M, 2), N - 3))
    want = exact_rss(Phi, Y, model.theta_matrix(theta)[0]) / (N - 3)
    np.testing.assert_allclose(s2[0], want, rtol=rtol)
    # the expanded sums (data without factors) on the same fits: not within the tolerance
    old, _ = training_noise(model, dataclasses.replace(data, factor=None), theta)
    assert np.abs(old[0] / want - 1).max() > 1e3 * rtol


def test_theorem1_sigma_w_equals_the_pooled_residuals_of_the_samples():
    model = generic_model()
    data, Phi, Y = offset_data(model, 0.1)
    theta = least_squares(data.H.sum(axis=1), data.b.sum(axis=1))       # (1, p)
    Th = model.theta_matrix(theta)                                      # (1, n_y, n_phi)
    want = np.sqrt(exact_rss(Phi, Y, Th).sum() / (M * N * 2))
    got = theorem1_table(data, model, 0.05).to_frame()["sigma_w"].to_numpy()
    np.testing.assert_allclose(got, [want], rtol=1e-10)
    old = theorem1_table(dataclasses.replace(data, factor=None), model, 0.05)
    assert abs(old.to_frame()["sigma_w"].to_numpy()[0] / want - 1) > 1e-8


def test_factor_reproduces_the_gram_and_any_residual():
    """R'R is the Gram matrix of [Phi | Y] (of each group of targets); the residuals of an
    arbitrary Theta per client, and of one Theta for all, equal those of the samples; a
    client with fewer samples than columns gets zero rows below its factor."""
    model = generic_model()
    rng = np.random.default_rng(8)
    Phi, Y = rng.normal(size=(M * N, 3)), rng.normal(size=(M * N, 2))
    factor = ragged_stats(model, Phi, Y, np.full(M, N))[8][None]
    R = np.zeros((M, 5, 5))
    iu = np.triu_indices(5)
    R[:, iu[0], iu[1]] = factor[0]
    A = np.concatenate([Phi, Y], axis=-1).reshape(M, N, 5)
    np.testing.assert_allclose(np.swapaxes(R, 1, 2) @ R, np.swapaxes(A, 1, 2) @ A,
                               rtol=1e-12, atol=1e-10)
    assert (np.diagonal(R, axis1=1, axis2=2) >= 0).all()
    theta = rng.normal(size=(1, M, model.p))
    np.testing.assert_allclose(residual_sums(model, factor, theta)[0],
                               exact_rss(Phi, Y, model.theta_matrix(theta)[0]), rtol=1e-12)
    shared = rng.normal(size=(1, 1, model.p))
    np.testing.assert_allclose(residual_sums(model, factor, shared)[0],
                               exact_rss(Phi, Y, model.theta_matrix(shared)[0]), rtol=1e-12)
    # two samples, five columns: rows 2.. of R are zero, residuals still exact
    few = sample_stats(model, Phi[None, :2], Y[None, :2], np.ones((1, 2)))[8]
    R2 = np.zeros((5, 5))
    R2[np.triu_indices(5)] = few[0]
    assert not R2[2:].any()
    t = theta[0, :1]
    r = Y[:2] - Phi[:2] @ model.theta_matrix(t)[0].T
    np.testing.assert_allclose(residual_sums(model, few[None], t[None])[0, 0], (r * r).sum(0),
                               rtol=1e-12)


def test_local_intervals_and_the_personalize_message_use_the_factors():
    """The residual variances of the clients' own intervals (``own_intervals``) and of their
    ``personalize=auto`` message equal the residuals of the samples in extended precision to
    1e-9 on targets at 1e4 with residuals of 0.1, where the expanded sums are off by more."""
    from fnsysid.learning import personalize as pers
    from fnsysid.results.personal import own_intervals, own_sse, target_stats

    model = generic_model()
    data, Phi, Y = offset_data(model, 0.1)
    blocks = pers.noise_blocks(model.structure)
    _, _, s2, dof = own_intervals(model, data)
    Th = model.theta_matrix(own_fits(data)[0])                         # (M, n_y, n_phi)
    want = blocks.per_block(exact_rss(Phi, Y, Th)) / dof[0]
    assert np.abs(s2[0] / want - 1).max() <= 1e-9
    yy, _ = target_stats(model, data)
    msg = pers.client_message(data.H, data.b, yy, data.n, blocks, own_sse(model, data))
    assert msg.own.all()
    # the message floors a variance below EXACT of the target's mean square (a target
    # updated exactly): at 1e4 with residuals of 0.1 the first target sits below it
    ms = blocks.per_block(yy) / (data.n[..., None] * blocks.n_targets)
    floor = pers.EXACT * ms[0]
    assert ((want > floor).sum(axis=0) >= 3).any()                  # some values not floored
    np.testing.assert_allclose(msg.rss[0] / msg.dof[0], np.maximum(want, floor), rtol=1e-9)
    # without the factors: the expanded sums, off by more than the bound
    old = pers.least_squares_intervals(data.H, data.b, yy, data.n, blocks)[2]
    assert np.abs(old[0] / want - 1).max() > 1e-7
