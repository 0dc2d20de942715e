"""A bare-numpy floor of the pendulum run: the same arithmetic as ``run.py``, written by hand.

``floor_pendulum`` does what ``python run.py system=pendulum M=.. N=.. T=.. K=.. R=.. repeats=1``
does with the default settings (FedAvg, full-batch GD with the diagonal preconditioner and the
mean gradient, one held-out trajectory per client scored every round, the free run every
``eval_every`` rounds, Theorem 1's constants), but as one would write it for this one system:
one random generator drawing in bulk, the 2 x 2 algebra spelled out entry by entry on (M,)
arrays, no config, no files. It draws as many random numbers as the run (the initial states,
scaled by 0, included), so the time it takes is a floor for the run's arithmetic.
``scripts/bench.py`` times it beside the run and prints the ratio.
"""

from __future__ import annotations

import time

import numpy as np

#: the pendulum of conf/system/pendulum.yaml
M_KG, L_M, G, DT, GAIN = 0.1, 0.5, 9.81, 0.01, 2.0
ETA_CLIP, W_SCALE, W_CLIP = 1.0, 0.1, 1.0
#: clients simulated at once
CHUNK = 1 << 15


def _truncated(rng, z: np.ndarray, cut: float) -> np.ndarray:
    """Redraw the entries of ``z`` beyond ``cut`` until none is left (in place)."""
    bad = np.flatnonzero(np.abs(z) > cut)
    while bad.size:
        z.flat[bad] = rng.standard_normal(bad.size)
        bad = bad[np.abs(z.flat[bad]) > cut]
    return z


def _simulate(rng, A, B, N: int, T: int):
    """States and features of N trajectories per client: phi (2, m, N, T), y (m, N, T),
    states (2, m, N, T + 1), inputs (m, N, T)."""
    m = len(A)
    z = rng.standard_normal((m, N, 2 + 3 * T))
    x0 = 0.0 * z[..., :2]                               # x0 ~ N(0, 0): drawn, scaled by 0
    noise = z[..., 2:].reshape(m, N, T, 3)
    eta = _truncated(rng, np.ascontiguousarray(noise[..., 0]), ETA_CLIP)
    w = W_SCALE * _truncated(rng, np.ascontiguousarray(noise[..., 1:]), W_CLIP / W_SCALE)
    alpha, omega = np.empty((m, N, T + 1)), np.empty((m, N, T + 1))
    alpha[..., 0], omega[..., 0] = x0[..., 0], x0[..., 1]
    phi, y, uu = np.empty((2, m, N, T)), np.empty((m, N, T)), np.empty((m, N, T))
    a, b = A[:, None], B[:, None]
    for t in range(T):
        s = np.sin(alpha[..., t])
        u = uu[..., t] = -GAIN * omega[..., t] + eta[..., t]
        alpha[..., t + 1] = alpha[..., t] + DT * (omega[..., t] + w[..., t, 0])
        omega[..., t + 1] = omega[..., t] + DT * (-a * G * s + b * u + w[..., t, 1])
        phi[0, ..., t], phi[1, ..., t] = -G * s * DT, u * DT
        y[..., t] = omega[..., t + 1] - omega[..., t]
    return phi, y, np.stack([alpha, omega]), uu


def _sums(phi, y):
    """Per-client sums over the samples: gram entries, cross terms, yy, max |phi|^2, means."""
    f0, f1 = phi[0].reshape(len(y), -1), phi[1].reshape(len(y), -1)
    yv = y.reshape(len(y), -1)
    n = f0.shape[1]
    return dict(g00=np.einsum("mn,mn->m", f0, f0), g01=np.einsum("mn,mn->m", f0, f1),
                g11=np.einsum("mn,mn->m", f1, f1), c0=np.einsum("mn,mn->m", yv, f0),
                c1=np.einsum("mn,mn->m", yv, f1), yy=np.einsum("mn,mn->m", yv, yv),
                phi2max=(f0 * f0 + f1 * f1).max(axis=1), phi_mean0=f0.sum(1) / n,
                phi_mean1=f1.sum(1) / n, y_mean=yv.sum(1) / n)


def floor_pendulum(M: int, N: int = 10, T: int = 5, K: int = 5, R: int = 200, lr: float = 1e-2,
                   eps: float = 0.01, val_N: int = 1, eval_every: int = 50, seed: int = 0):
    """Run the floor; return (errors (R + 1, 2) of e_max, e_mean, timings dict)."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    nominal = np.array([1.0 / L_M, 1.0 / (M_KG * L_M * L_M)])
    theta = nominal + eps * rng.random((M, 2))
    A, B = theta[:, 0].copy(), theta[:, 1].copy()
    keys = ("g00", "g01", "g11", "c0", "c1", "yy", "phi2max", "phi_mean0", "phi_mean1", "y_mean")
    tr = {k: np.empty(M) for k in keys}
    ho = {k: np.empty(M) for k in keys}
    std = np.empty((2, M))
    hx, hu = np.empty((2, M, val_N, T + 1)), np.empty((M, val_N, T))
    for lo in range(0, M, CHUNK):
        hi = min(lo + CHUNK, M)
        phi, y, _, _ = _simulate(rng, A[lo:hi], B[lo:hi], N, T)
        for k, v in _sums(phi, y).items():
            tr[k][lo:hi] = v
        phi, y, x, u = _simulate(rng, A[lo:hi], B[lo:hi], val_N, T)
        for k, v in _sums(phi, y).items():
            ho[k][lo:hi] = v
        hx[:, lo:hi], hu[lo:hi] = x, u
        std[:, lo:hi] = x.reshape(2, hi - lo, -1).std(axis=-1)
    n, n_ho = float(N * T), float(val_N * T)
    # Theorem 1's constants from the pooled data
    Hp = np.array([[tr["g00"].sum(), tr["g01"].sum()], [tr["g01"].sum(), tr["g11"].sum()]])
    bp = np.array([tr["c0"].sum(), tr["c1"].sum()])
    tp = np.linalg.solve(Hp, bp)
    sigma_w = np.sqrt(max(tr["yy"].sum() - 2 * bp @ tp + tp @ Hp @ tp, 0.0) / (M * n))
    theory = (sigma_w, 2 * np.linalg.eigvalsh(Hp)[0] / (M * n), tr["phi2max"].max(),
              2 * np.sqrt(((theta - theta.mean(0)) ** 2).sum(1)).max())
    t_data = time.perf_counter() - t0

    t0 = time.perf_counter()
    # K steps of preconditioned mean-gradient GD as one map per client, entry by entry
    d0, d1 = n / tr["g00"], n / tr["g11"]
    a00, a01 = 1 - lr * d0 * tr["g00"] / n, -lr * d0 * tr["g01"] / n
    a10, a11 = -lr * d1 * tr["g01"] / n, 1 - lr * d1 * tr["g11"] / n
    P = (np.ones(M), np.zeros(M), np.zeros(M), np.ones(M))     # A^k
    S = (np.zeros(M),) * 4                                   # sum_{j<k} A^j
    Ap, Tp = (a00, a01, a10, a11), (np.ones(M), np.zeros(M), np.zeros(M), np.ones(M))

    def mul(X, Y):
        return (X[0] * Y[0] + X[1] * Y[2], X[0] * Y[1] + X[1] * Y[3],
                X[2] * Y[0] + X[3] * Y[2], X[2] * Y[1] + X[3] * Y[3])

    k = K
    while k:
        if k & 1:
            P, S = mul(Ap, P), tuple(s + t for s, t in zip(S, mul(P, Tp), strict=True))
        k >>= 1
        if k:
            Tp = tuple(s + t for s, t in zip(Tp, mul(Ap, Tp), strict=True))
            Ap = mul(Ap, Ap)
    u0, u1 = lr * d0 * tr["c0"] / n, lr * d1 * tr["c1"] / n
    Pbar = np.array([[P[0].mean(), P[1].mean()], [P[2].mean(), P[3].mean()]])
    qbar = np.array([(S[0] * u0 + S[1] * u1).mean(), (S[2] * u0 + S[3] * u1).mean()])
    # per-round scores
    norm = np.sqrt(A * A + B * B)
    w_step = 1.0 / (std[1] * np.sqrt(n_ho))
    w_run = 0.5 / (std * np.sqrt(val_N * T))
    server = np.zeros(2)
    out = np.empty((R + 1, 6))
    e, sse, tmp = np.empty(M), np.empty(M), np.empty(M)
    for r in range(R + 1):
        if r:
            server = Pbar @ server + qbar
        s0, s1 = server
        np.subtract(s0, A, out=e)
        e *= e
        np.subtract(s1, B, out=tmp)
        tmp *= tmp
        e += tmp
        np.sqrt(e, out=e)
        e /= norm
        sse[:] = ho["yy"]
        for coef, key in ((-2 * s0, "c0"), (-2 * s1, "c1"), (s0 * s0, "g00"),
                          (2 * s0 * s1, "g01"), (s1 * s1, "g11")):
            np.multiply(ho[key], coef, out=tmp)
            sse += tmp
        np.maximum(sse, 0.0, out=sse)
        np.sqrt(sse, out=sse)
        sse *= w_step
        out[r, :4] = e.max(), e.mean(), sse.max(), sse.mean()
        if r == 0 or r == R or r % eval_every == 0:
            al, om = hx[0, ..., 0].copy(), hx[1, ..., 0].copy()
            sa, so = np.zeros(al.shape), np.zeros(al.shape)
            for t in range(T):
                om_next = om + (server[0] * -G * np.sin(al) * DT + server[1] * hu[..., t] * DT)
                al = al + DT * om
                om = om_next
                sa += (al - hx[0, ..., t + 1]) ** 2
                so += (om - hx[1, ..., t + 1]) ** 2
            run = np.sqrt(sa.sum(-1)) * w_run[0] + np.sqrt(so.sum(-1)) * w_run[1]
            out[r, 4:] = run.max(), run.mean()
    t_train = time.perf_counter() - t0
    return out, dict(data_s=t_data, train_s=t_train, theory=theory)
