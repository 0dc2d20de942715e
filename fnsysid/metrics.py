"""How good an estimate is: the relative parameter error of each client (paper eq. 9)."""

from __future__ import annotations

import numpy as np


class ParameterErrors:
    """``||theta_hat - theta_i*|| / ||theta_i*||`` for fixed true parameters ``theta_true``
    (S, M, p), evaluated once per round.

    The norms of the true parameters are computed once and the parameters kept one
    coordinate after another, so an evaluation is a few passes over contiguous (S, M) arrays.

    Examples
    --------
    >>> err = ParameterErrors(np.array([[[3.0, 4.0], [0.0, 2.0]]]))
    >>> err(np.zeros((1, 1, 2)))
    array([[1., 1.]])
    """

    def __init__(self, theta_true: np.ndarray):
        self.coords = np.ascontiguousarray(np.moveaxis(theta_true, -1, 0))   # (p, S, M)
        self.norm = np.linalg.norm(theta_true, axis=-1)

    def __call__(self, estimate: np.ndarray) -> np.ndarray:
        """Errors (S, M) of ``estimate`` broadcastable to (S, M, p)."""
        est = np.moveaxis(np.asarray(estimate, float), -1, 0)
        acc = None
        for e_k, t_k in zip(est, self.coords, strict=True):
            d = e_k - t_k
            np.multiply(d, d, out=d)
            acc = d if acc is None else np.add(acc, d, out=acc)
        np.sqrt(acc, out=acc)
        acc /= self.norm
        return acc


def client_errors(estimate: np.ndarray, theta_true: np.ndarray) -> np.ndarray:
    """Paper eq. 9: ``||theta_hat - theta_i*|| / ||theta_i*||`` per repeat and client, (S, M).

    ``estimate`` broadcasts against ``theta_true`` (S, M, p); the norm is the Euclidean norm of
    the parameter vector (the Frobenius norm for matrix parameters).
    """
    return ParameterErrors(theta_true)(estimate)


# --- prediction on held-out trajectories (no ground truth needed) ------------------------------

def _theta_matrix_per_client(model, theta: np.ndarray) -> np.ndarray:
    """``Theta`` (S, M or 1, n_y, n_phi) of estimates (S, M or 1, p)."""
    return model.theta_matrix(np.asarray(theta, float))


def nrmse_one_step(model, theta: np.ndarray, ho) -> np.ndarray:
    """One-step-ahead NRMSE of each client's held-out data, (S, M); NaN without held-out data.

    For each regression target ``j`` (the next value of state ``s_j``, see
    :attr:`System.target_states`): ``RMSE_j / std(x_{s_j})``, averaged over targets, with the
    squared error ``yy_j - 2 Theta_j . cross_j + Theta_j gram Theta_j'`` from held-out
    sufficient statistics: O(n_y n_phi^2) per client, whatever the amount of held-out data.
    States constant over a client's held-out data are left out of the average.
    """
    Th = _theta_matrix_per_client(model, theta)                # (S, m, n_y, n_phi)
    S, M = ho.n.shape
    n_phi = ho.gram.shape[-1]
    if Th.shape[1] == 1:     # one model for all clients: matrix products over the clients axis
        outer = np.einsum("sjk,sjl->sjkl", Th[:, 0], Th[:, 0]).reshape(S, -1, n_phi * n_phi)
        quad = ho.gram.reshape(S, M, -1) @ outer.transpose(0, 2, 1)
        lin = ho.cross.reshape(S, M, -1) * Th[:, 0].reshape(S, 1, -1)
        lin = lin.reshape(S, M, -1, n_phi).sum(axis=-1)
    else:
        quad = np.einsum("smjk,smkl,smjl->smj", Th, ho.gram, Th)
        lin = np.einsum("smjk,smjk->smj", Th, ho.cross)
    sse = np.maximum(ho.yy - 2.0 * lin + quad, 0.0)
    std = ho.std[..., model.system.target_states]
    with np.errstate(divide="ignore", invalid="ignore"):
        rmse = np.sqrt(sse / ho.n[..., None])
        return _mean_over_states(rmse, std, ho.valid)


def _mean_over_states(rmse: np.ndarray, std: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Mean of ``rmse / std`` over states with ``std > 0``; NaN for clients not ``valid``."""
    use = std > 0
    ratio = np.where(use, rmse / np.where(use, std, 1.0), 0.0)
    k = use.sum(axis=-1)
    out = ratio.sum(axis=-1) / np.maximum(k, 1)
    return np.where(valid & (k > 0), out, np.nan)


def free_run(model, theta: np.ndarray, x: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Simulate the model from each trajectory's first state with the recorded inputs.

    ``theta`` (S, M or 1, p); ``x`` (S, M, J, L, n_x); ``u`` (S, M, J, L - 1, n_u). Returns the
    simulated states (S, M, J, L, n_x); a rollout that blows up holds inf or NaN.
    """
    th = np.asarray(theta, float)[:, :, None, :]
    out = np.empty(np.broadcast_shapes(x.shape, th.shape[:3] + x.shape[3:]))
    out[..., 0, :] = x[..., 0, :]
    with np.errstate(all="ignore"):
        for t in range(x.shape[-2] - 1):
            out[..., t + 1, :] = model.predict(out[..., t, :], u[..., t, :], th)
    return out


def one_step(model, theta: np.ndarray, x: np.ndarray, u: np.ndarray) -> np.ndarray:
    """One-step-ahead predictions of states ``x[..., 1:, :]`` from the measured states."""
    th = np.asarray(theta, float)[:, :, None, None, :]
    with np.errstate(all="ignore"):
        return model.predict(x[..., :-1, :], u, th)


def nrmse_free_run(model, theta: np.ndarray, ho) -> np.ndarray:
    """Free-run simulation NRMSE of each client's held-out trajectories, (S, M).

    Per state: RMSE of the rollout over all held-out samples after the first, divided by the
    state's standard deviation over the held-out data; averaged over states. A rollout that
    blows up gives ``inf`` for that client (NaN: no held-out data).
    """
    sim = free_run(model, theta, ho.x, ho.u)
    m = ho.mask[..., 1:]
    with np.errstate(all="ignore"):
        err = np.where(m[..., None], sim[..., 1:, :] - ho.x[..., 1:, :], 0.0)
        sse = (err * err).sum(axis=(2, 3))                    # (S, M, n_x)
        rmse = np.sqrt(sse / np.maximum(m.sum(axis=(2, 3)), 1)[..., None])
        out = _mean_over_states(rmse, ho.std, ho.valid)
    return np.where(np.isnan(out) & ho.valid, np.inf, out)


def over_clients(v: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Max and mean over the clients axis of (S, M) values, counting only ``valid`` clients
    (NaN where a repeat has none); ``inf`` propagates."""
    k = valid.sum(axis=1)
    with np.errstate(invalid="ignore"):
        vmax = np.where(valid, v, -np.inf).max(axis=1)
        vmean = np.where(valid, v, 0.0).sum(axis=1) / np.maximum(k, 1)
    return np.where(k > 0, vmax, np.nan), np.where(k > 0, vmean, np.nan)
