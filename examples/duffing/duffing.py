"""A Duffing oscillator fleet: a system of your own, outside the fnsysid package.

``x1' = x2``, ``x2' = -delta x2 - alpha x1 - beta x1^3 + b u``, forward Euler with step ``dt``
and a disturbance on the velocity. The model is linear in ``theta = (delta, alpha, beta, b)``;
the regression is written on the velocity increment::

    x2_{t+1} - x2_t = dt [-x2_t, -x1_t, -x1_t^3, u_t] . theta + dt w_t

Use it with its YAML in ``conf/system/duffing.yaml`` (see README, "Your own system")::

    PYTHONPATH=examples/duffing python run.py --config-dir examples/duffing/conf system=duffing
"""

from __future__ import annotations

import numpy as np

from fnsysid.dynamics.systems import System, dense_structure


class Duffing(System):
    """Duffing oscillators whose clients differ along ``directions`` of the parameters.

    Parameters
    ----------
    delta, alpha, beta, b : float
        Nominal damping, linear stiffness, cubic stiffness and input gain.
    dt : float
        Euler step (s), positive.
    directions : list of lists, (n_gamma, 4)
        Client i has ``theta_0 + gamma_i @ directions``, ``gamma_i ~ U(0, eps)``.
    x0, inputs, disturbance : mapping
        Noise specs (:class:`fnsysid.dynamics.random.Noise`) of the initial state (2), the input (1)
        and the velocity disturbance (1).
    """

    name = "duffing"
    n_x, n_u, n_w = 2, 1, 1
    param_names = ["delta", "alpha", "beta", "b"]

    def __init__(self, delta: float, alpha: float, beta: float, b: float, dt: float,
                 directions, x0, inputs, disturbance):
        for key, value in (("delta", delta), ("alpha", alpha), ("beta", beta), ("b", b),
                           ("dt", dt)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not np.isfinite(value):
                raise ValueError(f"duffing: {key}={value}; allowed: a finite number")
        super().__init__(x0, inputs, disturbance, dt=dt)
        if not dt > 0:
            raise ValueError(f"duffing: dt={dt}; allowed: a positive number")
        self.nominal = np.array([delta, alpha, beta, b], dtype=float)
        self.directions = np.atleast_2d(np.asarray(directions, dtype=float))
        if self.directions.shape[1] != 4:
            raise ValueError(f"duffing: directions has {self.directions.shape[1]} columns; "
                             "allowed: 4 (delta, alpha, beta, b)")

    # simulation: x (..., 2), u (..., 1), w (..., 1), theta (..., 4)
    def step(self, x, u, w, theta):
        y = np.einsum("...k,...k->...", self.features(x, u), theta) + self.dt * w[..., 0]
        return self.predict(x, u, y[..., None])

    # regression: features of (x_t, u_t), targets, and the next state from predicted targets
    def features(self, x, u):
        x1, x2 = x[..., 0], x[..., 1]
        return self.dt * np.stack([-x2, -x1, -x1 ** 3, u[..., 0]], axis=-1)

    def regression(self, x, u):
        return self.features(x[..., :-1, :], u), x[..., 1:, 1:2] - x[..., :-1, 1:2]

    def predict(self, x, u, y):
        return np.stack([x[..., 0] + self.dt * x[..., 1], x[..., 1] + y[..., 0]], axis=-1)

    @property
    def structure(self):
        return dense_structure(1, 4)           # Theta (1 x 4) = theta

    @property
    def feature_names(self):
        return ["-x2*dt", "-x1*dt", "-x1^3*dt", "u*dt"]

    @property
    def target_names(self):
        return ["d_x2"]

    @property
    def target_states(self):
        return [1]                             # the target predicts the next x2

    @property
    def state_names(self):
        return ["x1", "x2"]

    @property
    def input_names(self):
        return ["u"]
