"""``personalize=auto`` on Duffing fleets without heterogeneity, against the clients' own least
squares (``local``) and pooled least squares, by the mean squared error of the clients'
parameters (every client and coefficient of the degree-3 polynomial library).

Each seed draws a fleet of ``--M`` identical Duffing oscillators (forward Euler, dt 0.05,
damping 0.3, alpha 1, beta 0.5, input gain 1), ``--N`` trajectories of ``--T`` samples a client
from random starts and inputs, velocity disturbance ``--noise``; the statistics ``H_i``,
``b_i``, ``yy_i`` are summed from the library's features and the one-step targets, and
:func:`fnsysid.learning.personalize.auto` runs on them as in a run. Prints one row a seed and
the ratio of ``auto`` to the better of ``local`` and ``pooled``.

    python scripts/personalized_duffing.py --seeds 12
"""

from __future__ import annotations

import argparse

import numpy as np

from fnsysid.dynamics.features import Polynomial
from fnsysid.learning.personalize import auto, noise_blocks

DT, DELTA, ALPHA, BETA, B = 0.05, 0.3, 1.0, 0.5, 1.0


def fleet(rng, M: int, N: int, T: int, noise: float):
    """Features (M, N T, n_phi) and next states (M, N T, 2) of one fleet, and the feature
    names."""
    lib = Polynomial(degree=3)
    X, Y = [], []
    for _ in range(M):
        x = np.empty((N, T + 1, 2))
        x[:, 0] = rng.normal(size=(N, 2))
        u = rng.normal(size=(N, T + 1))
        w = noise * rng.normal(size=(N, T))
        for t in range(T):
            x1, x2 = x[:, t, 0], x[:, t, 1]
            x[:, t + 1, 0] = x1 + DT * x2
            x[:, t + 1, 1] = x2 + DT * (-DELTA * x2 - ALPHA * x1 - BETA * x1 ** 3 + B * u[:, t]
                                        + w[:, t])
        X.append(lib.transform(x[:, :-1].reshape(-1, 2), u[:, :-1].reshape(-1, 1)))
        Y.append(x[:, 1:].reshape(-1, 2))
    return np.stack(X), np.stack(Y), lib.feature_names(2, 1)


def truth(names: list[str]) -> np.ndarray:
    """The true coefficients (2 n_phi,) of ``x1+`` and ``x2+`` on the library's features
    (named ``x0`` for x1, ``x1`` for x2, ``u0`` for u)."""
    want = [{"x0": 1.0, "x1": DT},
            {"x1": 1.0 - DT * DELTA, "x0": -DT * ALPHA, "x0^3": -DT * BETA, "u0": DT * B}]
    return np.concatenate([[w.get(n, 0.0) for n in names] for w in want])


def one_seed(seed: int, M: int, N: int, T: int, noise: float) -> dict:
    rng = np.random.default_rng(seed)
    X, Y, names = fleet(rng, M, N, T, noise)
    n_phi = X.shape[-1]
    G = np.einsum("mtk,mtl->mkl", X, X)
    H = np.zeros((1, M, 2 * n_phi, 2 * n_phi))
    for j in range(2):
        H[0, :, j * n_phi:(j + 1) * n_phi, j * n_phi:(j + 1) * n_phi] = G
    b = np.einsum("mtk,mtj->mjk", X, Y).reshape(1, M, 2 * n_phi)
    yy = np.einsum("mtj,mtj->mj", Y, Y)[None]
    n = np.full((1, M), float(N * T))
    structure = np.zeros((2, n_phi, 2 * n_phi))
    for j in range(2):
        structure[j, np.arange(n_phi), j * n_phi + np.arange(n_phi)] = 1.0
    theta, _, fl = auto(H, b, yy, n, noise_blocks(structure))
    local = np.linalg.solve(H[0], b[0][..., None])[..., 0]
    pooled = np.linalg.solve(H[0].sum(axis=0), b[0].sum(axis=0))
    true = truth(names)
    mse = {"auto": float(((theta[0] - true) ** 2).mean()),
           "local": float(((local - true) ** 2).mean()),
           "pooled": float(((pooled - true) ** 2).mean())}
    mse["ratio"] = mse["auto"] / min(mse["local"], mse["pooled"])
    return mse


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=12, help="fleets, seeds 0 ... seeds-1")
    ap.add_argument("--M", type=int, default=20, help="clients a fleet")
    ap.add_argument("--N", type=int, default=2, help="trajectories a client")
    ap.add_argument("--T", type=int, default=50, help="samples a trajectory")
    ap.add_argument("--noise", type=float, default=0.5, help="velocity disturbance")
    a = ap.parse_args(argv)
    for key, low in (("seeds", 1), ("M", 2), ("N", 1), ("T", 1)):
        if getattr(a, key) < low:
            ap.error(f"--{key}={getattr(a, key)} is not allowed: an integer >= {low}")
    if not (np.isfinite(a.noise) and a.noise >= 0):
        ap.error(f"--noise={a.noise} is not allowed: a finite number >= 0")
    print("seed      auto     local    pooled  auto/best")
    ratios = []
    for s in range(a.seeds):
        r = one_seed(s, a.M, a.N, a.T, a.noise)
        ratios.append(r["ratio"])
        print(f"{s:4d} {r['auto']:.3e} {r['local']:.3e} {r['pooled']:.3e} {r['ratio']:9.3f}")
    print(f"auto / best: median {np.median(ratios):.3f}, max {np.max(ratios):.3f} "
          f"over {a.seeds} seeds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
