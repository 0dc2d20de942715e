"""Replay the published pendulum notebook's Fig. 1(a) on its own data, with its own update and
with FedAvg.

The published code (https://github.com/OMKARTT/FNSysId at commit
8768f90febde0f040e364d974661e5bc46e2c933, ``fl_pend_sys_id/PendulumSysID.ipynb`` cells 1 to 6
and ``fl_pend_sys_id/pendulum_dynamics.py``) is followed step by step, written anew here:

- data (``traj_generate``): client parameters ``A_i = 2 + eps r``, ``B_i = 40 + eps r'`` drawn
  from numpy's global generator (``np.random.rand``, M times M draws each, the last M kept);
  trajectory ``e`` of every client uses the same noise: ``np.random.seed(100 + e)`` then an
  exploration noise truncnorm(-1, 1, 0, 1) of 5 samples, ``np.random.seed(300 + e)`` then two
  disturbances truncnorm(-10, 10, 0, 0.1) of 5 samples; ``x0 = 0``, ``u = -2 omega + eta``,
  Euler with ``dt = 0.01``; regressor ``dt [-g sin(alpha), u]``, target ``omega' - omega``;
- local step (``improved_gradient_descent``): features z-scored per client (centred, divided by
  their standard deviation + 1e-8), targets as they are, ``np.random.permutation`` of the
  samples each epoch, one full-batch step of the mean gradient with ``lr 1e-3 / (1 + 0.01 k)``;
  the client's model in physical units is the z-scored model divided by the standard deviation;
- round (``sys_id``): the notebook passes the server's array to each client, which updates it
  **in place**, so client i starts from client i-1's result (cyclic updates, M K sequential
  steps per round); the server model is that array, the reported model the mean over the
  clients of their models in physical units; ``e_r`` the max over clients of the relative error;
- the figure: M in 1, 9, 25, 49, 64, 81, N = 10, eps = 0.01, R = 50, K = 1, 5 repeats in that
  order in one process (the generator's state runs on from one call to the next), the curve the
  mean over the repeats.

``--update fedavg`` gives each client a copy of the server model (Algorithm 1, parallel
clients) and changes nothing else. The one draw the notebook does not fix is numpy's global
state before its first call (a fresh kernel); ``--seeds`` replays from several such states.

Usage: python scripts/replay_pendulum_notebook.py [--seeds 0 1 2] [--out figures/...csv]
"""

# numpy's legacy global generator is what the notebook draws from; the replay must use it
# ruff: noqa: NPY002

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import truncnorm

G, DT, GAIN, STEPS = 9.81, 0.01, 2.0, 5
A0, B0 = 1 / 0.5, 1 / (0.1 * 0.5 * 0.5)
#: e_50 of the published notebook's Fig. 1(a) as docs/SOURCES.md lists them (M: e_50)
PUBLISHED = {1: 0.953, 9: 0.670, 25: 0.363, 49: 0.142, 64: 0.070, 81: 0.024}
ROOT = Path(__file__).resolve().parent.parent


def trajectory(A: float, B: float, e: int) -> tuple[np.ndarray, np.ndarray]:
    """Regressors (5, 2) and targets (5,) of trajectory ``e`` of a client with ``A``, ``B``."""
    np.random.seed(100 + e)
    eta = truncnorm(-1.0, 1.0, loc=0.0, scale=1.0).rvs(size=STEPS)
    np.random.seed(300 + e)
    w1 = truncnorm(-10.0, 10.0, loc=0.0, scale=0.1).rvs(size=STEPS)
    w2 = truncnorm(-10.0, 10.0, loc=0.0, scale=0.1).rvs(size=STEPS)
    alpha = omega = 0.0
    X, y = [], []
    for t in range(STEPS):
        u = -GAIN * omega + eta[t]
        feature = np.array([-G * math.sin(alpha), u])
        alpha_next = alpha + DT * (omega + w1[t])
        omega_next = omega + DT * (-G * math.sin(alpha) * A + u * B + w2[t])
        X.append(DT * feature)
        y.append(omega_next - omega)
        alpha, omega = alpha_next, omega_next
    return np.array(X), np.array(y)


def clients(M: int, N: int, eps: float):
    """Each client's regressors and targets and the true (A_i, B_i), drawn as traj_generate."""
    for _ in range(M):                    # the notebook redraws the lists M times
        A = [A0 + eps * np.random.rand() for _ in range(M)]
        B = [B0 + eps * np.random.rand() for _ in range(M)]
    data = []
    for j in range(M):
        parts = [trajectory(A[j], B[j], e) for e in range(N)]
        data.append((np.vstack([p[0] for p in parts]), np.concatenate([p[1] for p in parts])))
    return data, np.column_stack([A, B])


def local_gd(x, y, params, epochs: int, lr: float):
    """improved_gradient_descent with SGD=False: updates ``params`` in place; returns it and
    the model in physical units."""
    x_std = x.std(axis=0) + 1e-8
    xn = (x - x.mean(axis=0)) / x_std
    for epoch in range(epochs):
        idx = np.random.permutation(len(xn))
        xs, ys = xn[idx], y[idx]
        params -= lr / (1 + 0.01 * epoch) * (xs.T @ (xs @ params - ys)) / len(xs)
    return params, params / x_std


def sys_id(M, N, eps, R, K, update: str, lr: float = 1e-3) -> list[float]:
    """e_r, r = 1..R, of one call of the notebook's sys_id."""
    data, truth = clients(M, N, eps)
    theta_s = np.zeros(2)
    errors = []
    for _ in range(R):
        models, physical = [], []
        for x, y in data:
            start = theta_s if update == "cyclic" else theta_s.copy()
            params, phys = local_gd(x, y, start, K, lr)
            models.append(params)
            physical.append(phys)
        theta_s = np.mean(models, axis=0)
        final = np.mean(physical, axis=0)
        errors.append(float(np.max(np.linalg.norm(final - truth, axis=1)
                                   / np.linalg.norm(truth, axis=1))))
    return errors


def figure_a(update: str, seed: int, q: int = 5, R: int = 50, K: int = 1) -> dict[int, float]:
    """The notebook's cell 6: e_R (mean over q repeats) per M, one process state throughout."""
    np.random.seed(seed)                  # the state of a fresh kernel, which it does not fix
    return {M: float(np.mean([sys_id(M, 10, 0.01, R, K, update)[-1] for _ in range(q)], axis=0))
            for M in PUBLISHED}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                    help="numpy global states before the first call (the notebook leaves it "
                         "unset)")
    ap.add_argument("--out", type=Path, default=ROOT / "figures" / "pendulum_notebook_replay.csv")
    args = ap.parse_args(argv)
    rows = []
    for update in ("cyclic", "fedavg"):
        for seed in args.seeds:
            for M, e in figure_a(update, seed).items():
                rows.append({"update": update, "start_seed": seed, "M": M, "e_50": e,
                             "published": PUBLISHED[M], "difference": e - PUBLISHED[M],
                             "contraction": (1 - 1e-3) ** (50 * M)})
    table = pd.DataFrame(rows)
    table.to_csv(args.out, index=False, float_format="%.5g")
    wide = table.pivot_table(index="M", columns="update", values="e_50", aggfunc=["min", "max"])
    print(wide.to_string(float_format="%.4f"))
    print(f"largest |cyclic - published|: "
          f"{table.loc[table['update'] == 'cyclic', 'difference'].abs().max():.4f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
