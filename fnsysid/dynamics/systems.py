"""Client system families: nominal parameters, heterogeneity, policies and dynamics.

Every family is linear in its physical parameters ``theta`` (paper eq. 1). Client ``i`` has
``theta_i* = theta_0 + gamma_i @ directions`` with ``gamma_i ~ U(0, eps)`` drawn per client and
per direction. A system simulates batches of trajectories with externally drawn noise (so that
the random streams stay in :mod:`fnsysid.dynamics.random`) and writes its own regression
``y_t = Theta phi_t + noise`` whose matrix ``Theta`` is a linear function of ``theta``:
``Theta[j, k] = sum_p structure[j, k, p] * theta[p]``.
"""

from __future__ import annotations

import re

import numpy as np

from fnsysid.config.registry import Registered
from fnsysid.dynamics.features import Fourier, Identity, Library
from fnsysid.dynamics.random import Noise, StreamBatch


def _put(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` (same number of entries), one coordinate (last axis) at a time: into
    a strided view, copying a short last axis whole is several times slower."""
    src = src.reshape(dst.shape)
    for c in range(dst.shape[-1]):
        dst[..., c] = src[..., c]


class System(Registered):
    """Base class of a client family.

    Subclasses set ``name``, ``n_x``, ``n_u``, ``param_names``, ``nominal`` (p0,) and
    ``directions`` (n_gamma, p0), and implement ``policy``, ``step``, ``regression`` and
    ``structure``. Arrays carry any leading batch axes (clients, trajectories).

    Parameters
    ----------
    x0, inputs, disturbance : mapping or fnsysid.dynamics.random.Noise
        The distributions of the initial state, the exploration noise of the inputs and the
        disturbance (:meth:`fnsysid.dynamics.random.Noise.from_spec`).
    dt : float, default=1.0
        The sample time.
    """

    config_group = "system"
    name = "system"
    n_x = n_u = n_w = 0
    param_names: list[str] = []
    #: True when generic feature libraries may replace the system's own features
    generic_features = False
    #: False for a system without a nominal model or simulator (data come from files)
    simulates = True

    def __init__(self, x0, inputs, disturbance, dt: float = 1.0):
        self.x0 = Noise.from_spec(x0)
        self.inputs = Noise.from_spec(inputs)
        self.disturbance = Noise.from_spec(disturbance)
        self.dt = float(dt)

    # --- parameters -------------------------------------------------------------------------
    def client_params(self, gamma: np.ndarray) -> np.ndarray:
        """``theta_0 + gamma @ directions`` for gamma of shape (..., n_gamma)."""
        return self.nominal + np.asarray(gamma) @ self.directions

    @property
    def n_gamma(self) -> int:
        return self.directions.shape[0]

    # --- data -------------------------------------------------------------------------------
    def draw(self, rng: np.random.Generator | StreamBatch, size: int, T: int, out=None):
        """Draw one trajectory's randomness for ``size`` clients, in time order.

        Returns ``x0`` (size, n_x), ``eta`` (size, T, n_u) and ``w`` (size, T, n_w). Values for
        step ``t`` are drawn before those of step ``t + 1``, so a longer horizon extends a
        shorter one. From a :class:`~fnsysid.dynamics.random.StreamBatch` of G streams (see
        :attr:`batchable`) every array gets a leading axis G, row g being stream g's draw.
        ``out``: three arrays (or views) to write into instead, of shapes ``lead + (size,
        ...)`` with ``lead`` any shape of G entries (row g of the draws lands at its C-order
        place in ``lead``); they are returned.
        """
        lead = (len(rng),) if isinstance(rng, StreamBatch) else ()
        if out is None:
            out = (np.empty(lead + (size, self.n_x)), np.empty(lead + (size, T, self.n_u)),
                   np.empty(lead + (size, T, self.n_w)))
        x0, eta, w = out
        _put(x0, self.x0.sample(rng, (size, self.n_x)))
        for t in range(T):
            _put(eta[..., t, :], self.inputs.sample(rng, (size, self.n_u)))
            _put(w[..., t, :], self.disturbance.sample(rng, (size, self.n_w)))
        return x0, eta, w

    def expected_draws(self, size: int, T: int) -> float:
        """Mean number of standard normals one :meth:`draw` reads."""
        return (self.x0.expected_draws((size, self.n_x))
                + T * (self.inputs.expected_draws((size, self.n_u))
                       + self.disturbance.expected_draws((size, self.n_w))))

    @property
    def batchable(self) -> bool:
        """Whether :meth:`draw` can read a StreamBatch (every noise draws normals only)."""
        return all(n.kind in Noise.BATCHED_KINDS
                   for n in (self.x0, self.inputs, self.disturbance))

    def simulate(self, theta, x0, eta, w):
        """Roll out trajectories.

        Parameters
        ----------
        theta : numpy.ndarray, shape (B, p0)
            The client parameters.
        x0 : numpy.ndarray, shape (B, N, n_x)
            The initial states.
        eta : numpy.ndarray, shape (B, N, T, n_u)
            The exploration noise of the inputs.
        w : numpy.ndarray, shape (B, N, T, n_w)
            The disturbance.

        Returns
        -------
        x : numpy.ndarray, shape (B, N, T + 1, n_x)
            The states.
        u : numpy.ndarray, shape (B, N, T, n_u)
            The applied inputs.
        """
        B, N, T = eta.shape[:3]
        # time-major: each step reads and writes whole contiguous (B, N, .) arrays
        x = np.empty((T + 1, B, N, self.n_x))
        u = np.empty((T, B, N, self.n_u))
        x[0] = x0
        th = np.asarray(theta)[:, None, :]
        eta, w = np.moveaxis(eta, 2, 0), np.moveaxis(w, 2, 0)
        for t in range(T):
            u[t] = self.policy(x[t], eta[t])
            x[t + 1] = self.step(x[t], u[t], w[t], th)
        return np.moveaxis(x, 0, 2), np.moveaxis(u, 0, 2)

    def policy(self, x, eta):
        """Input applied at state ``x`` given exploration noise ``eta`` (default: ``u = eta``)."""
        return eta

    # --- names of the columns of trajectory files --------------------------------------------
    @property
    def state_names(self) -> list[str]:
        """Names of the states (columns of trajectory files), ``x0, x1, ...`` by default."""
        return [f"x{j}" for j in range(self.n_x)]

    @property
    def input_names(self) -> list[str]:
        """Names of the inputs (columns of trajectory files), ``u0, u1, ...`` by default."""
        return [f"u{j}" for j in range(self.n_u)]

    def name_features(self, names: list[str]) -> list[str]:
        """Names of a generic library's features as shown in parameter names (unchanged)."""
        return names

    # --- prediction ---------------------------------------------------------------------------
    @property
    def target_states(self) -> list[int]:
        """Index of the state whose next value each regression target predicts (n_y,).

        The one-step error of these states depends on the parameters; default: target ``j``
        is state ``j``.
        """
        return list(range(len(self.target_names)))

    def features(self, x, u):  # pragma: no cover - abstract
        """Regression features ``phi`` (..., n_phi) of states ``x`` and inputs ``u``."""
        raise NotImplementedError

    def predict(self, x, u, y):
        """Next state (..., n_x) from the state, the input and predicted targets ``y`` (..., n_y).

        The inverse of the regression's targets; default: the targets are the next state.
        """
        return y

    def step(self, x, u, w, theta):  # pragma: no cover - abstract
        raise NotImplementedError

    def regression(self, x, u):  # pragma: no cover - abstract
        """Return ``Phi`` (..., T, n_phi) and targets ``Y`` (..., T, n_y) of a trajectory batch."""
        raise NotImplementedError

    @property
    def structure(self) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def feature_names(self) -> list[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def target_names(self) -> list[str]:  # pragma: no cover - abstract
        raise NotImplementedError


class DenseSystem(System):
    """``x_{t+1} = A f(x_t) + B u_t + w_t`` with a dense parameter matrix ``[A B]``.

    The own parameter vector is ``[A B]`` flattened row by row. ``f`` is the system's own
    library on the states; generic libraries may replace it when they contain its features.

    Parameters
    ----------
    A0 : array_like, shape (n_x, n_x)
        The nominal ``A``.
    B0 : array_like, shape (n_x, n_u)
        The nominal ``B``.
    V : array_like, shape (n_x, n_x)
        The direction in which the clients' ``A`` differ.
    U : array_like, shape (n_x, n_u)
        The direction in which the clients' ``B`` differ.
    x0, inputs, disturbance : mapping, Noise or None, default=None
        The distributions of the initial state, the inputs and the disturbance; None: a
        standard normal.
    """

    generic_features = True

    def __init__(self, A0, B0, V, U, x0=None, inputs=None, disturbance=None):
        A0, B0 = np.asarray(A0, float), np.asarray(B0, float)
        V, U = np.asarray(V, float), np.asarray(U, float)
        self.n_x, self.n_u = B0.shape
        self.n_w = self.n_x
        if A0.shape != (self.n_x, self.n_x) or V.shape != A0.shape or U.shape != B0.shape:
            raise ValueError(f"system: A0 {A0.shape}, V {V.shape} must be square n_x x n_x and "
                             f"B0 {B0.shape}, U {U.shape} must be n_x x n_u")
        unit = {"kind": "normal", "scale": 1.0}
        super().__init__(x0 or unit, inputs or unit, disturbance or unit, dt=1.0)
        theta0 = np.concatenate([A0, B0], axis=1)
        self.nominal = theta0.ravel()
        dA = np.concatenate([V, np.zeros_like(B0)], axis=1).ravel()
        dB = np.concatenate([np.zeros_like(A0), U], axis=1).ravel()
        self.directions = np.stack([dA, dB])
        feats = self.feature_names
        self.param_names = [f"{t}:{f}" for t in self.target_names for f in feats]

    #: library of the state part of the model (the input part is always ``u``)
    state_library: Library = Identity("x")

    @property
    def library(self) -> Library:
        """The system's own feature map ``[f(x); u]``."""
        return self.state_library + Identity("u")

    @property
    def feature_names(self):
        return self.library.feature_names(self.n_x, self.n_u)

    @property
    def target_names(self):
        return [f"x{j}+" for j in range(self.n_x)]

    @property
    def structure(self):
        n_phi = self.n_x + self.n_u
        return dense_structure(self.n_x, n_phi)

    def step(self, x, u, w, theta):
        Theta = theta.reshape(theta.shape[:-1] + (self.n_x, self.n_x + self.n_u))
        phi = self.library.transform(x, u)
        return np.einsum("...jk,...k->...j", Theta, phi) + w

    def features(self, x, u):
        return self.library.transform(x, u)

    def regression(self, x, u):
        return self.features(x[..., :-1, :], u), x[..., 1:, :]


def dense_structure(n_y: int, n_phi: int) -> np.ndarray:
    """Structure tensor of a dense ``n_y x n_phi`` matrix flattened row by row.

    Parameters
    ----------
    n_y : int
        The targets.
    n_phi : int
        The features.

    Returns
    -------
    numpy.ndarray, shape (n_y, n_phi, n_y * n_phi)
        0/1: parameter ``j n_phi + k`` multiplies feature k in target j.
    """
    S = np.zeros((n_y, n_phi, n_y * n_phi))
    for j in range(n_y):
        for k in range(n_phi):
            S[j, k, j * n_phi + k] = 1.0
    return S


class Synthetic(DenseSystem):
    """The paper's synthetic family ``x_{t+1} = A_i sin(x_t) + B_i u_t + w_t`` (Sec. IV-A-1)."""

    settings = "Dense"

    name = "synthetic"
    state_library = Fourier("x", cos=False)


class Linear(DenseSystem):
    """FedSysID's linear family ``x_{t+1} = A_i x_t + B_i u_t + w_t``."""

    settings = "Dense"

    name = "linear"
    state_library = Identity("x")


class Pendulum(System):
    """Damped-by-feedback pendulum, forward Euler (paper Sec. IV-A-2, Musavi et al. Sec. 4).

    ``alpha' = omega``, ``omega' = -A g sin(alpha) + B u`` with ``A = 1/l`` and
    ``B = 1/(m l^2)``; ``u = -gain * omega + eta``. The regression is written on the velocity:
    ``omega_{t+1} - omega_t = [A, B] . dt [-g sin(alpha_t), u_t] + dt w2_t``.

    Parameters
    ----------
    m : float
        Mass, positive.
    l : float
        Length, positive.
    g : float
        Gravitational acceleration.
    dt : float
        Euler step.
    gain : float
        The velocity feedback's gain.
    x0, inputs, disturbance : mapping or fnsysid.dynamics.random.Noise
        The distributions of the initial state, the exploration noise of the inputs and the
        disturbance (:meth:`fnsysid.dynamics.random.Noise.from_spec`).
    """

    settings = "Pendulum"

    name = "pendulum"
    n_x, n_u, n_w = 2, 1, 2
    param_names = ["A", "B"]

    def __init__(self, m: float, l: float, g: float, dt: float, gain: float,  # noqa: E741
                 x0, inputs, disturbance):
        super().__init__(x0, inputs, disturbance, dt=dt)
        if m <= 0 or l <= 0:
            raise ValueError(f"system: m={m}, l={l}; allowed: positive values")
        self.m, self.l, self.g, self.gain = float(m), float(l), float(g), float(gain)
        self.nominal = np.array([1.0 / l, 1.0 / (m * l * l)])
        self.directions = np.eye(2)

    def policy(self, x, eta):
        return -self.gain * x[..., 1:2] + eta

    def step(self, x, u, w, theta):
        alpha, omega = x[..., 0], x[..., 1]
        A, B = theta[..., 0], theta[..., 1]
        dt = self.dt
        alpha_next = alpha + dt * (omega + w[..., 0])
        omega_next = omega + dt * (-A * self.g * np.sin(alpha) + B * u[..., 0] + w[..., 1])
        return np.stack([alpha_next, omega_next], axis=-1)

    def features(self, x, u):
        return self.dt * np.stack([-self.g * np.sin(x[..., 0]), u[..., 0]], axis=-1)

    def regression(self, x, u):
        y = x[..., 1:, 1:2] - x[..., :-1, 1:2]
        return self.features(x[..., :-1, :], u), y

    def predict(self, x, u, y):
        alpha, omega = x[..., 0], x[..., 1]
        return np.stack([alpha + self.dt * omega, omega + y[..., 0]], axis=-1)

    @property
    def state_names(self):
        return ["alpha", "omega"]

    @property
    def input_names(self):
        return ["u"]

    @property
    def target_states(self):
        return [1]

    @property
    def structure(self):
        return dense_structure(1, 2)

    @property
    def feature_names(self):
        return ["-g*sin(alpha)*dt", "u*dt"]

    @property
    def target_names(self):
        return ["d_omega"]


class Generic(System):
    """Unknown dynamics ``x_{t+1} = Theta phi(x_t, u_t)`` of named states and inputs.

    No nominal model and no simulator: the data come from files (``data=files``). Its own
    features are ``[x; u]``; any generic feature map may replace them. Parameter names use the
    column names, e.g. ``x1+:x2*u``.

    Parameters
    ----------
    states : list of str
        Names of the state columns (at least one).
    inputs : list of str, default=()
        Names of the input columns (may be empty).
    """

    settings = "Generic"

    name = "generic"
    generic_features = True
    simulates = False

    def __init__(self, states, inputs=()):
        states, inputs = list(states or []), list(inputs or [])
        if not states:
            raise ValueError("system=generic identifies trajectories read from files; give "
                             "data=files data.path=... data.states=[x1,x2,...] and, if any, "
                             "data.inputs=[u,...]")
        names = states + inputs
        if len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"data.states={states}, data.inputs={inputs}: names must be "
                             "distinct non-empty strings")
        zero = {"kind": "zero"}
        super().__init__(zero, zero, zero)
        self._states, self._inputs = states, inputs
        self.n_x, self.n_u = len(states), len(inputs)
        self.n_w = self.n_x
        self.library = Identity("xu")
        self.param_names = [f"{t}:{f}" for t in self.target_names for f in self.feature_names]
        self.nominal = np.zeros(len(self.param_names))
        self.directions = np.zeros((0, self.nominal.size))

    @property
    def state_names(self):
        return list(self._states)

    @property
    def input_names(self):
        return list(self._inputs)

    def name_features(self, names):
        """``x0``, ``u1`` inside feature names become the column names (also after a
        harmonic's number: ``sin(2x0)`` -> ``sin(2theta)``)."""
        cols = {"x": self._states, "u": self._inputs}
        return [re.sub(r"(?<![A-Za-z_])([xu])(\d+)(?![0-9])",
                       lambda m: cols[m.group(1)][int(m.group(2))], n) for n in names]

    @property
    def feature_names(self):
        return self.name_features(self.library.feature_names(self.n_x, self.n_u))

    @property
    def target_names(self):
        return [f"{s}+" for s in self._states]

    @property
    def structure(self):
        return dense_structure(self.n_x, self.n_x + self.n_u)

    def features(self, x, u):
        return self.library.transform(x, u)

    def regression(self, x, u):
        return self.features(x[..., :-1, :], u), x[..., 1:, :]

    def step(self, x, u, w, theta):
        raise ValueError("system=generic has no dynamics to simulate; use data=files")
