"""Tests of the quadrotor family: parameters, dynamics, policy and the exact regression."""

from pathlib import Path

import numpy as np
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from fnsysid.dynamics.quadrotor import Quadrotor, rotate_ez

CONF = Path(__file__).resolve().parents[1] / "conf" / "system" / "quadrotor.yaml"
CONTROLLER = {"f0": 5.0, "z_ref": 5.0, "kp_z": 0.755, "kd_z": 1.25, "kp_q": 0.03,
              "kd_omega": 0.00875, "c": [1.0, 2.0, 2.0]}


def from_yaml(**overrides) -> Quadrotor:
    cfg = OmegaConf.load(CONF)
    for key in ("knobs", "solver", "init"):
        cfg.pop(key)
    for key, val in overrides.items():
        cfg[key] = val
    return instantiate(cfg, _convert_="all")


def from_kwargs(**overrides) -> Quadrotor:
    kwargs = dict(m=0.468, Ixx=4.856, Iyy=4.856, Izz=8.801, drag=0.25, g=9.81, dt=0.01,
                  identify_drag=False,
                  x0={"kind": "normal", "loc": [0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 10, 10, 10],
                      "scale": 0.0},
                  inputs={"kind": "uniform", "scale": [1.0, 0.2, 0.2, 0.2]},
                  disturbance={"kind": "uniform", "scale": 1.0}, controller=CONTROLLER)
    kwargs.update(overrides)
    return Quadrotor(**kwargs)


def design(system: Quadrotor, phi: np.ndarray) -> np.ndarray:
    """Rows G[j, p] = sum_k structure[j, k, p] phi[k], stacked over samples and targets."""
    G = np.einsum("jkp,sk->sjp", system.structure, phi.reshape(-1, 12))
    return G.reshape(-1, system.nominal.size)


def test_nominal_parameters_match_formulas():
    sys = from_yaml()
    expected = [1 / 0.468, 1 / 4.856, (4.856 - 8.801) / 4.856, 1 / 4.856,
                (8.801 - 4.856) / 4.856, 1 / 8.801, 0.0]
    np.testing.assert_allclose(sys.nominal, expected, rtol=1e-15, atol=1e-15)
    np.testing.assert_array_equal(sys.directions, [[1, 0, 0, 0, 0, 0, 0]])
    assert len(sys.param_names) == 7 and sys.n_gamma == 1

    sysd = from_yaml(identify_drag=True, drag=[0.1, 0.2, 0.3])
    np.testing.assert_allclose(sysd.nominal[7:], [-0.1 / 0.468, -0.2 / 0.468, -0.3 / 0.468])
    np.testing.assert_allclose(sysd.directions, [[1, 0, 0, 0, 0, 0, 0, -0.1, -0.2, -0.3]])
    # the perturbation keeps the drag terms consistent with the perturbed inverse mass
    th = sysd.client_params(np.array([0.5]))
    np.testing.assert_allclose(th[7:], -np.array([0.1, 0.2, 0.3]) * th[0])


def test_yaml_and_kwargs_agree():
    a, b = from_yaml(), from_kwargs()
    np.testing.assert_array_equal(a.nominal, b.nominal)
    np.testing.assert_array_equal(a.structure, b.structure)
    x = np.r_[0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 10, 10, 10.0]
    np.testing.assert_array_equal(a.policy(x, np.zeros(4)), b.policy(x, np.zeros(4)))


@pytest.mark.parametrize("identify_drag", [False, True])
def test_pooled_least_squares_recovers_theta(identify_drag):
    sys = from_yaml(identify_drag=identify_drag, disturbance={"kind": "zero"})
    rng = np.random.default_rng(0)
    B, N, T = 3, 4, 10
    x0, eta, w = sys.draw(rng, B * N, T)
    # spread the initial velocity, attitude and rates so every parameter is excited
    x0[:, 3:6] = 0.5 * rng.standard_normal((B * N, 3))
    q = rng.standard_normal((B * N, 4))
    x0[:, 6:10] = q / np.linalg.norm(q, axis=1, keepdims=True)
    x0[:, 10:13] += 0.5 * rng.standard_normal((B * N, 3))
    theta = sys.client_params(rng.uniform(0, 0.1, size=(B, 1)))
    x, u = sys.simulate(theta, x0.reshape(B, N, 13), eta.reshape(B, N, T, 4),
                        w.reshape(B, N, T, 6))
    phi, Y = sys.regression(x, u)
    assert phi.shape == (B, N, T, 12) and Y.shape == (B, N, T, 6)
    for i in range(B):
        G = design(sys, phi[i])
        est = np.linalg.lstsq(G, Y[i].ravel(), rcond=None)[0]
        np.testing.assert_allclose(est, theta[i], rtol=0, atol=1e-8)
        # and the matrix form: Y = Phi Theta^T
        Theta = np.einsum("jkp,p->jk", sys.structure, theta[i])
        np.testing.assert_allclose(Y[i], phi[i] @ Theta.T, rtol=0, atol=1e-12)


def test_quaternion_stays_unit_norm():
    sys = from_yaml()
    rng = np.random.default_rng(0)
    x0, eta, w = sys.draw(rng, 5, 10)
    x0[:, 10:13] += 3.0 * rng.standard_normal((5, 3))
    x, _ = sys.simulate(sys.nominal[None], x0[None], eta[None], w[None])
    norms = np.linalg.norm(x[..., 6:10], axis=-1)
    np.testing.assert_allclose(norms, 1.0, atol=1e-14)
    # the attitude actually moves (omega ~ 10 rad/s over 0.1 s)
    assert np.all(np.abs(x[0, :, -1, 6] - 1.0) > 1e-3)


def test_one_euler_step_by_hand():
    sys = from_kwargs()
    dt, g, m, drag = 0.01, 9.81, 0.468, 0.25
    Ixx, Iyy, Izz = 4.856, 4.856, 8.801
    x = np.r_[1.0, 2.0, 3.0, 0.1, -0.2, 0.3, 1.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0]
    u = np.r_[5.0, 0.1, 0.0, 0.0]
    w = np.r_[0.0, 0.0, 0.0, 0.0, 0.5, 0.0]
    nxt = sys.step(x, u, w, sys.nominal)
    v = np.r_[0.1, -0.2, 0.3]
    # identity attitude: thrust along +z
    v_next = v + dt * (np.r_[0, 0, -g] + np.r_[0, 0, 5.0] / m - drag / m * v)
    # omega' = I^-1 (tau - omega x I omega) computed directly
    Iv = np.r_[Ixx, Iyy, Izz]
    om = np.r_[1.0, 2.0, 3.0]
    om_dot = (np.r_[0.1, 0, 0] - np.cross(om, Iv * om)) / Iv + np.r_[0, 0.5, 0]
    q_next = np.r_[1.0, 0.5 * dt * 1, 0.5 * dt * 2, 0.5 * dt * 3]
    q_next /= np.linalg.norm(q_next)
    np.testing.assert_allclose(nxt[0:3], [1.0 + dt * 0.1, 2.0 - dt * 0.2, 3.0 + dt * 0.3])
    np.testing.assert_allclose(nxt[3:6], v_next, rtol=1e-14)
    np.testing.assert_allclose(nxt[6:10], q_next, rtol=1e-14)
    np.testing.assert_allclose(nxt[10:13], om + dt * om_dot, rtol=1e-14)
    # numbers: vz' = -9.81 + 5/0.468 - 0.25*0.3/0.468 = 0.7232...
    assert nxt[5] == pytest.approx(0.3 + dt * (-9.81 + 5 / 0.468 - 0.075 / 0.468), rel=1e-14)
    # wx' = 0.1/Ixx + (Iyy - Izz)/Ixx * wy wz = 0.0206 - 0.8124 * 6
    assert nxt[10] == pytest.approx(1.0 + dt * (0.1 / Ixx + (Iyy - Izz) / Ixx * 6), rel=1e-14)


def test_step_broadcasts_client_parameters():
    sys = from_kwargs(identify_drag=True)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 13))
    u, w = rng.standard_normal((2, 3, 4)), np.zeros((2, 3, 6))
    theta = sys.client_params(np.array([[0.0], [1.0]]))
    batched = sys.step(x, u, w, theta[:, None, :])
    for i in range(2):
        for n in range(3):
            np.testing.assert_array_equal(batched[i, n], sys.step(x[i, n], u[i, n], w[i, n],
                                                                  theta[i]))
    # the heavier-thrust client (larger 1/m) accelerates more in the thrust direction
    assert not np.allclose(batched[0, :, 3:6], batched[1, :, 3:6])


def test_policy_is_the_published_pd_controller():
    sys = from_yaml()
    # small rotation about x: q = (cos a/2, sin a/2, 0, 0)
    a = 0.2
    x = np.r_[0, 0, 1, 0, 0, 0.4, np.cos(a / 2), np.sin(a / 2), 0, 0, 1.0, -2.0, 3.0]
    eta = np.r_[0.3, 0.01, 0.02, 0.03]
    u = sys.policy(x, eta)
    assert u[0] == pytest.approx(5 + 0.755 * (5 - 1) - 1.25 * 0.4 + 0.3)
    qw, qx = np.cos(a / 2), np.sin(a / 2)
    # restoring: positive roll gives negative attitude torque about x
    assert u[1] == pytest.approx(-0.00875 * 1.0 - 1.0 * 0.03 * qx * qw + 0.01)
    assert u[2] == pytest.approx(-0.00875 * -2.0 + 0.02)
    assert u[3] == pytest.approx(-0.00875 * 3.0 + 0.03)


def test_structure_rows():
    sys = from_kwargs()
    S = sys.structure
    assert S.shape == (6, 12, 7)
    Theta = np.einsum("jkp,p->jk", S, sys.nominal)
    inv_m = 1 / 0.468
    np.testing.assert_allclose(np.diag(Theta[:3, :3]), inv_m)
    np.testing.assert_allclose(np.diag(Theta[:3, 3:6]), -0.25 * inv_m)
    np.testing.assert_allclose(Theta[3:, 9:], np.diag([1 / 4.856, 1 / 4.856, 1 / 8.801]))
    np.testing.assert_allclose(np.diag(Theta[3:, 6:9]), sys.nominal[[2, 4, 6]])
    assert np.count_nonzero(Theta) == 6 + 3 + 2  # theta_7 = 0 since Ixx = Iyy
    assert len(sys.feature_names) == 12 and len(sys.target_names) == 6


@pytest.mark.parametrize("bad, name", [({"m": 0.0}, "m"), ({"m": -1.0}, "m"),
                                       ({"Izz": 0.0}, "Izz"), ({"drag": [0.1, 0.2]}, "drag"),
                                       ({"identify_drag": "yes"}, "identify_drag"),
                                       ({"controller": {"kp_z": 1.0}}, "controller")])
def test_bad_arguments_raise(bad, name):
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        from_kwargs(**bad)


def test_attitude_conventions():
    # R(q) e_z of a right-handed rotation by a about x is (0, -sin a, cos a)
    a = 0.3
    q = np.r_[np.cos(a / 2), np.sin(a / 2), 0.0, 0.0]
    np.testing.assert_allclose(rotate_ez(q), [0.0, -np.sin(a), np.cos(a)], atol=1e-15)
    # omega is a body rate: after a 90 deg yaw the body x axis is the inertial y axis, so
    # rolling about body x tilts the thrust axis towards +x_inertial
    sys = from_kwargs(dt=1e-4)
    x = np.r_[0, 0, 0, 0, 0, 0, np.cos(np.pi / 4), 0, 0, np.sin(np.pi / 4), 1.0, 0, 0]
    for _ in range(1000):
        x = sys.step(x, np.zeros(4), np.zeros(6), sys.nominal)
    np.testing.assert_allclose(rotate_ez(x[6:10]), [np.sin(0.1), 0.0, np.cos(0.1)], atol=1e-6)
