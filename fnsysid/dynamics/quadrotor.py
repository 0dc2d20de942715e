"""Quadrotor client family: rigid-body dynamics linear in seven (or ten) physical parameters."""

from __future__ import annotations

import numpy as np

from fnsysid.dynamics.systems import System

#: gains of the nominal PD controller (Alaimo et al. 2013 style), all required
CONTROLLER_KEYS = ("f0", "z_ref", "kp_z", "kd_z", "kp_q", "kd_omega", "c")


def rotate_ez(q: np.ndarray) -> np.ndarray:
    """Third column ``R(q) e_z`` of the rotation matrix of a scalar-first quaternion.

    Parameters
    ----------
    q : numpy.ndarray, shape (..., 4)
        Unit quaternions, scalar first.

    Returns
    -------
    numpy.ndarray, shape (..., 3)
    """
    qw, qx, qy, qz = np.moveaxis(q, -1, 0)
    return np.stack([2.0 * (qx * qz + qw * qy),
                     2.0 * (qy * qz - qw * qx),
                     qw * qw - qx * qx - qy * qy + qz * qz], axis=-1)


class Quadrotor(System):
    """Quadrotor with quaternion attitude, forward Euler (paper appendix; Musavi et al. Sec. 4).

    State ``x = (p, v, q, omega)`` (13): inertial position and velocity, scalar-first attitude
    quaternion ``(qw, qx, qy, qz)`` and body rates. Input ``u = (f, tau_x, tau_y, tau_z)``:
    total thrust along the body z axis and body torques. Disturbance ``w`` (6) enters ``v'``
    and ``omega'``::

        p' = v
        v' = -g e_z + (1/m) R(q) e_z f - (drag/m) v + w[:3]
        q' = 0.5 q (x) (0, omega)                 (q renormalized after every step)
        omega' = I^-1 (tau - omega x I omega) + w[3:]

    Parameters ``theta`` (the paper's seven): ``1/m, 1/Ixx, (Iyy-Izz)/Ixx, 1/Iyy,
    (Izz-Ixx)/Iyy, 1/Izz, (Ixx-Iyy)/Izz``; with ``identify_drag`` three more, ``-drag_j/m``.
    Clients differ in inverse mass only: ``theta_1 + gamma``, ``gamma ~ U(0, eps)``.

    The regression is written on the velocities: ``Y_t = [v_{t+1} - v_t + dt g e_z,
    omega_{t+1} - omega_t]`` and ``Phi_t = dt [R(q_t) e_z f_t, v_t, wy wz, wx wz, wx wy, tau_t]``
    with ``Y_t = Theta(theta) Phi_t + dt w_t`` exactly.

    Parameters
    ----------
    m : float
        Mass (kg), positive.
    Ixx, Iyy, Izz : float
        Principal moments of inertia, positive.
    drag : float or sequence of 3 floats
        Linear drag coefficients per inertial axis, non-negative.
    g : float
        Gravitational acceleration.
    dt : float
        Euler step, positive.
    identify_drag : bool
        Identify the three drag terms ``-drag_j/m`` (10 parameters) instead of treating the
        drag as known (7 parameters).
    x0, inputs, disturbance : mapping
        :class:`fnsysid.dynamics.random.Noise` specs of the initial state (13), the exploration
        noise (4) and the disturbance (6).
    controller : mapping
        Gains of the nominal controller, keys ``f0, z_ref, kp_z, kd_z, kp_q, kd_omega, c``
        (see :meth:`policy`).
    """

    settings = "Quadrotor"

    name = "quadrotor"
    n_x, n_u, n_w = 13, 4, 6

    def __init__(self, m: float, Ixx: float, Iyy: float, Izz: float, drag, g: float,
                 dt: float, identify_drag: bool, x0, inputs, disturbance, controller):
        super().__init__(x0, inputs, disturbance, dt=dt)
        for key, val in (("m", m), ("Ixx", Ixx), ("Iyy", Iyy), ("Izz", Izz), ("dt", dt)):
            if not np.isfinite(val) or val <= 0:
                raise ValueError(f"quadrotor: {key}={val}; allowed: positive values")
        if not np.isfinite(g):
            raise ValueError(f"quadrotor: g={g}; allowed: finite values")
        drag = np.asarray(drag, dtype=float)
        if drag.ndim == 0:
            drag = np.full(3, float(drag))
        if drag.shape != (3,) or np.any(drag < 0) or not np.all(np.isfinite(drag)):
            raise ValueError(f"quadrotor: drag={drag.tolist()}; allowed: a non-negative scalar "
                             "or a list of 3 non-negative values")
        if not isinstance(identify_drag, (bool, np.bool_)):
            raise ValueError(f"quadrotor: identify_drag={identify_drag!r}; allowed: true, false")
        for key, noise, n in (("x0", self.x0, self.n_x), ("inputs", self.inputs, self.n_u),
                              ("disturbance", self.disturbance, self.n_w)):
            for arr in (noise.loc, noise.scale):
                if arr.ndim > 1 or arr.size not in (1, n):
                    raise ValueError(f"quadrotor: {key} loc/scale of shape {arr.shape}; "
                                     f"allowed: a scalar or a list of {n} values")
        controller = dict(controller)
        if set(controller) != set(CONTROLLER_KEYS):
            raise ValueError(f"quadrotor: controller keys {sorted(controller)}; allowed: "
                             f"exactly {', '.join(CONTROLLER_KEYS)}")
        c = np.asarray(controller["c"], dtype=float)
        if c.shape != (3,):
            raise ValueError(f"quadrotor: controller.c={controller['c']}; allowed: 3 values")

        self.m, self.Ixx, self.Iyy, self.Izz = float(m), float(Ixx), float(Iyy), float(Izz)
        self.drag, self.g, self.identify_drag = drag, float(g), bool(identify_drag)
        self.controller = {k: float(v) for k, v in controller.items() if k != "c"}
        self.controller["c"] = c

        nominal = [1.0 / m, 1.0 / Ixx, (Iyy - Izz) / Ixx, 1.0 / Iyy, (Izz - Ixx) / Iyy,
                   1.0 / Izz,
                   # the paper's appendix prints (Ixx - Izz)/Izz here; the z row of
                   # I^-1 (tau - omega x I omega) gives (Ixx - Iyy)/Izz (zero when Ixx = Iyy)
                   (Ixx - Iyy) / Izz]
        names = ["1/m", "1/Ixx", "(Iyy-Izz)/Ixx", "1/Iyy", "(Izz-Ixx)/Iyy", "1/Izz",
                 "(Ixx-Iyy)/Izz"]
        direction = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        if self.identify_drag:
            nominal += list(-drag / m)
            names += ["-drag_x/m", "-drag_y/m", "-drag_z/m"]
            # a change of inverse mass also changes the drag acceleration -drag_j/m
            direction += list(-drag)
        self.nominal = np.array(nominal)
        self.param_names = names
        self.directions = np.array([direction])

    # --- dynamics ---------------------------------------------------------------------------
    def policy(self, x, eta):
        """Nominal PD controller plus exploration noise ``eta`` (..., 4).

        ``f = f0 + kp_z (z_ref - p_z) - kd_z v_z`` and ``tau_j = -kd_omega omega_j +
        c_j kp_q qe_j qe_w``, where ``qe = conj(q) (x) q_ref`` is the error quaternion against
        the identity reference, i.e. ``qe = (qw, -qx, -qy, -qz)``.
        """
        k = self.controller
        pz, vz = x[..., 2], x[..., 5]
        qw, qv, omega = x[..., 6], x[..., 7:10], x[..., 10:13]
        thrust = k["f0"] + k["kp_z"] * (k["z_ref"] - pz) - k["kd_z"] * vz
        # qe = conj(q) as in the published code, so the attitude term restores towards identity
        qe = -qv
        torque = -k["kd_omega"] * omega + k["c"] * k["kp_q"] * qe * qw[..., None]
        return np.concatenate([thrust[..., None], torque], axis=-1) + eta

    def step(self, x, u, w, theta):
        """One forward-Euler step; ``theta`` (..., p) broadcasts against ``x`` (..., 13)."""
        theta = np.asarray(theta)
        dt = self.dt
        p, v, q, omega = x[..., 0:3], x[..., 3:6], x[..., 6:10], x[..., 10:13]
        f, tau = u[..., 0:1], u[..., 1:4]
        inv_m = theta[..., 0:1]
        if self.identify_drag:
            drag_accel = theta[..., 7:10] * v
        else:
            drag_accel = -self.drag * inv_m * v
        accel = inv_m * rotate_ez(q) * f + drag_accel + w[..., 0:3]
        accel[..., 2] -= self.g
        wx, wy, wz = omega[..., 0], omega[..., 1], omega[..., 2]
        th = [theta[..., j] for j in range(1, 7)]
        alpha = np.stack([th[0] * tau[..., 0] + th[1] * wy * wz,
                          th[2] * tau[..., 1] + th[3] * wx * wz,
                          th[4] * tau[..., 2] + th[5] * wx * wy], axis=-1) + w[..., 3:6]
        # q (x) (0, omega): body rates act on the right
        q_next = self._attitude_step(q, omega)
        return np.concatenate([p + dt * v, v + dt * accel, q_next, omega + dt * alpha], axis=-1)

    # --- regression -------------------------------------------------------------------------
    def features(self, x, u):
        """Features ``phi`` (..., 12) of states (..., 13) and inputs (..., 4)."""
        v, q, omega = x[..., 3:6], x[..., 6:10], x[..., 10:13]
        wx, wy, wz = omega[..., 0], omega[..., 1], omega[..., 2]
        return self.dt * np.concatenate([rotate_ez(q) * u[..., 0:1], v,
                                         np.stack([wy * wz, wx * wz, wx * wy], axis=-1),
                                         u[..., 1:4]], axis=-1)

    def regression(self, x, u):
        """Features ``Phi`` (..., T, 12) and targets ``Y`` (..., T, 6) of trajectories.

        ``x`` has shape (..., T + 1, 13) and ``u`` (..., T, 4).
        """
        phi = self.features(x[..., :-1, :], u)
        dv = x[..., 1:, 3:6] - x[..., :-1, 3:6]
        dv[..., 2] += self.dt * self.g
        domega = x[..., 1:, 10:13] - x[..., :-1, 10:13]
        return phi, np.concatenate([dv, domega], axis=-1)

    def predict(self, x, u, y):
        """Next state from predicted velocity and body-rate increments ``y`` (..., 6)."""
        dt = self.dt
        p, v, q, omega = x[..., 0:3], x[..., 3:6], x[..., 6:10], x[..., 10:13]
        v_next = v + y[..., 0:3]
        v_next[..., 2] -= dt * self.g
        return np.concatenate([p + dt * v, v_next, self._attitude_step(q, omega),
                               omega + y[..., 3:6]], axis=-1)

    def _attitude_step(self, q, omega):
        """``q + dt/2 q (x) (0, omega)``, renormalized."""
        qw, qv = q[..., 0:1], q[..., 1:4]
        q_dot = 0.5 * np.concatenate([-np.sum(qv * omega, axis=-1, keepdims=True),
                                      qw * omega + np.cross(qv, omega)], axis=-1)
        q_next = q + self.dt * q_dot
        return q_next / np.linalg.norm(q_next, axis=-1, keepdims=True)

    @property
    def state_names(self):
        return ["px", "py", "pz", "vx", "vy", "vz", "qw", "qx", "qy", "qz", "wx", "wy", "wz"]

    @property
    def input_names(self):
        return ["f", "tau_x", "tau_y", "tau_z"]

    @property
    def target_states(self):
        return [3, 4, 5, 10, 11, 12]

    @property
    def structure(self):
        """Tensor (6, 12, p) with ``Theta[j, k] = sum_p structure[j, k, p] theta[p]``."""
        S = np.zeros((6, 12, self.nominal.size))
        for j in range(3):
            S[j, j, 0] = 1.0
            if self.identify_drag:
                S[j, 3 + j, 7 + j] = 1.0
            else:
                # drag is known: its acceleration -drag_j v_j / m rides on 1/m
                S[j, 3 + j, 0] = -self.drag[j]
        # omega_j' = 1/I_j * tau_j + (coupling) * (product of the other two rates)
        for j in range(3):
            S[3 + j, 9 + j, 1 + 2 * j] = 1.0
            S[3 + j, 6 + j, 2 + 2 * j] = 1.0
        return S

    @property
    def feature_names(self):
        """Names of the 12 regression features (columns of ``Phi``)."""
        return ["dt*f*(Rez)_x", "dt*f*(Rez)_y", "dt*f*(Rez)_z", "dt*v_x", "dt*v_y", "dt*v_z",
                "dt*w_y*w_z", "dt*w_x*w_z", "dt*w_x*w_y", "dt*tau_x", "dt*tau_y", "dt*tau_z"]

    @property
    def target_names(self):
        """Names of the 6 regression targets (columns of ``Y``)."""
        return ["d_vx", "d_vy", "d_vz+g*dt", "d_wx", "d_wy", "d_wz"]
