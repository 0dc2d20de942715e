"""How good an estimate is: the relative parameter error of each client (paper eq. 9)."""

from __future__ import annotations

import numpy as np


def client_errors(estimate: np.ndarray, theta_true: np.ndarray) -> np.ndarray:
    """Paper eq. 9: ``||theta_hat - theta_i*|| / ||theta_i*||`` per repeat and client, (S, M).

    ``estimate`` broadcasts against ``theta_true`` (S, M, p); the norm is the Euclidean norm of
    the parameter vector (the Frobenius norm for matrix parameters).
    """
    return np.linalg.norm(estimate - theta_true, axis=-1) / np.linalg.norm(theta_true, axis=-1)
