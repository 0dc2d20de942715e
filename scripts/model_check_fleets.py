"""Fleets for the model check's acceptance (docs/ALGORITHMS.md, "Model check").

CartPole-v1 (gymnasium's constants and Euler step, written here with numpy), Duffing,
pendulum and Lotka-Volterra fleets with process noise, and Duffing, Van der Pol and pendulum
fleets with little data a client (``*_few``; ``pendulum_het`` with a noise that grows with
the angle), run with several libraries; prints the held-out
free-run NRMSE and the model check's verdict of each, and over 20 seeds how often a library
that holds the true model gets a "missing terms" verdict (``--every``: every library on every
seed, with the verdicts of those that lack a true term).

    python scripts/model_check_fleets.py [--seeds 20] [--only cartpole,duffing,...] [--every]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from fnsysid.app.api import run_job
from fnsysid.results.modelcheck import verdict as verdict_line

# CartPole-v1 (gymnasium/envs/classic_control/cartpole.py): constants and the Euler step
GRAVITY, MASSCART, MASSPOLE, LENGTH, FORCE_MAG, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02


def cartpole_step(s, force, mp, half_length):
    """One Euler step (tau = 0.02) of states (..., 4) = (x, x_dot, theta, theta_dot)."""
    x, x_dot, th, th_dot = np.moveaxis(s, -1, 0)
    total = MASSCART + mp
    pml = mp * half_length
    c, sn = np.cos(th), np.sin(th)
    temp = (force + pml * th_dot ** 2 * sn) / total
    th_acc = (GRAVITY * sn - c * temp) / (half_length * (4.0 / 3.0 - mp * c ** 2 / total))
    x_acc = temp - pml * th_acc * c / total
    return np.stack([x + TAU * x_dot, x_dot + TAU * x_acc, th + TAU * th_dot,
                     th_dot + TAU * th_acc], axis=-1)


def frame(x, u, split, names, inputs):
    """Rows (client, trajectory, t, split, states..., inputs...) of x (M, J, T+1, n_x) and
    u (M, J, T+1, n_u)."""
    M, J, L = x.shape[:3]
    c, j, t = np.meshgrid(np.arange(M), np.arange(J), np.arange(L), indexing="ij")
    out = {"client": [f"c{k}" for k in c.ravel()], "trajectory": j.ravel(), "t": t.ravel(),
           "split": np.where(j.ravel() < J - split, "train", "val")}
    for i, n in enumerate(names):
        out[n] = x[..., i].ravel()
    for i, n in enumerate(inputs):
        out[n] = u[..., i].ravel()
    return pd.DataFrame(out)


def simulate(step, x0, u, noise, rng, noisy, spread=None):
    """Roll ``step(x, u_t)`` from x0 (M, J, n_x) with inputs u (M, J, T+1, n_u), adding
    ``noise`` N(0, 1) to the states ``noisy`` each step (times ``spread(x_t)`` (M, J, 1):
    a noise whose size depends on the state)."""
    T = u.shape[2] - 1
    x = np.empty(x0.shape[:2] + (T + 1, x0.shape[-1]))
    x[:, :, 0] = x0
    for t in range(T):
        nxt = step(x[:, :, t], u[:, :, t])
        size = noise if spread is None else noise * spread(x[:, :, t])
        nxt[..., noisy] += size * rng.normal(size=nxt[..., noisy].shape)
        x[:, :, t + 1] = nxt
    return x


def cartpole(seed, M=6, J=10, T=40, val=2, noise=0.02):
    rng = np.random.default_rng(seed)
    mp = MASSPOLE * (1 + 0.05 * rng.uniform(-1, 1, (M, 1)))
    hl = LENGTH * (1 + 0.05 * rng.uniform(-1, 1, (M, 1)))
    u = FORCE_MAG * rng.choice([-1.0, 1.0], size=(M, J, T + 1, 1))
    x0 = rng.uniform(-0.05, 0.05, (M, J, 4))
    x = simulate(lambda s, f: cartpole_step(s, f[..., 0], mp, hl), x0, u, noise, rng, [1, 3])
    return frame(x, u, val, ["x", "x_dot", "theta", "theta_dot"], ["force"]), \
        ["x", "x_dot", "theta", "theta_dot"], ["force"]


def duffing(seed, M=8, J=8, T=60, val=2, noise=0.1, dt=0.05):
    rng = np.random.default_rng(seed)
    a, b = 1 + 0.2 * rng.random((M, 1)), 0.5 + 0.2 * rng.random((M, 1))

    def step(s, u):
        x1, x2 = s[..., 0], s[..., 1]
        return np.stack([x1 + dt * x2, x2 + dt * (-0.2 * x2 - a * x1 - b * x1 ** 3 + u[..., 0])],
                        -1)
    u = rng.normal(size=(M, J, T + 1, 1))
    x = simulate(step, rng.normal(size=(M, J, 2)), u, noise * dt, rng, [1])
    return frame(x, u, val, ["x1", "x2"], ["u"]), ["x1", "x2"], ["u"]


def duffing_few(seed):
    """The Duffing fleet with little data a client (two runs of 50 samples and one held out) and
    more noise: the small fleets of ``scripts/sparsity_recovery.py``, where a degree-3
    library has 20 terms a target for 98 training transitions."""
    return duffing(seed, M=20, J=3, T=50, val=1, noise=0.5)


def vdp_few(seed, M=20, J=3, T=40, val=1, noise=0.3, dt=0.05):
    """Van der Pol oscillators with little data a client (two training runs of 40 samples,
    one held out); a degree-3 library holds the truth, degree 2 lacks ``x1^2 x2``."""
    rng = np.random.default_rng(seed)
    mu = 1 + 0.2 * rng.random((M, 1))

    def step(s, u):
        x1, x2 = s[..., 0], s[..., 1]
        return np.stack([x1 + dt * x2, x2 + dt * (mu * (1 - x1 ** 2) * x2 - x1 + u[..., 0])],
                        -1)
    u = rng.normal(size=(M, J, T + 1, 1))
    x = simulate(step, rng.uniform(-2, 2, (M, J, 2)), u, noise * dt, rng, [1])
    return frame(x, u, val, ["x1", "x2"], ["u"]), ["x1", "x2"], ["u"]


def pendulum_few(seed):
    """Pendulums with little data a client (two training runs of 40 samples, one held out)
    and angles up to 2.5 rad; identity+sin holds the truth, a degree-3 polynomial does not
    (no ``sin``)."""
    return pendulum(seed, M=20, J=3, T=40, val=1, noise=0.2, amplitude=2.5)


def pendulum_het(seed):
    """``pendulum_few`` with a noise whose standard deviation is ``0.2 (0.2 + |theta|)``: it
    grows 13-fold over the angles the fleet visits (identity+sin still holds the mean
    dynamics)."""
    return pendulum(seed, M=20, J=3, T=40, val=1, noise=0.2, amplitude=2.5,
                    spread=lambda x: 0.2 + np.abs(x[..., :1]))


def pendulum(seed, M=8, J=8, T=80, val=2, noise=0.05, dt=0.05, amplitude=2.0, spread=None):
    rng = np.random.default_rng(seed)
    g = 9.81 / (1 + 0.1 * rng.random((M, 1)))

    def step(s, u):
        th, om = s[..., 0], s[..., 1]
        return np.stack([th + dt * om, om + dt * (-g * np.sin(th) - 0.1 * om + u[..., 0])], -1)
    u = rng.normal(size=(M, J, T + 1, 1))
    x = simulate(step, rng.uniform(-amplitude, amplitude, (M, J, 2)), u, noise * dt, rng, [1],
                 spread)
    return frame(x, u, val, ["theta", "omega"], ["u"]), ["theta", "omega"], ["u"]


def lotka_volterra(seed, M=100, J=4, T=60, val=1, noise=0.01, dt=0.05):
    rng = np.random.default_rng(seed)
    a = 1.0 + 0.1 * rng.random((M, 1))
    c = 1.0 + 0.1 * rng.random((M, 1))

    def step(s, u):
        x, y = s[..., 0], s[..., 1]
        return np.stack([x + dt * (a * x - x * y), y + dt * (-c * y + x * y)], -1)
    u = np.zeros((M, J, T + 1, 0))
    x = simulate(step, rng.uniform(0.5, 1.5, (M, J, 2)), u, noise, rng, [0, 1])
    return frame(x, u, val, ["x", "y"], []), ["x", "y"], []


FLEETS = {"cartpole": cartpole, "duffing": duffing, "duffing_few": duffing_few,
          "vdp_few": vdp_few, "pendulum": pendulum, "pendulum_few": pendulum_few,
          "pendulum_het": pendulum_het,
          "lotka_volterra": lotka_volterra}
#: the libraries run on each fleet; the first of the truth fleets holds the true model
LIBRARIES = {
    "cartpole": {"affine": ["feature_map=affine"],
                 "identity+sin+cos": ["feature_map=combined",
                                      "feature_map.libraries=[identity,sin,cos]"],
                 "polynomial3": ["feature_map=polynomial", "feature_map.degree=3"]},
    "duffing": {"polynomial3": ["feature_map=polynomial", "feature_map.degree=3"],
                "affine": ["feature_map=affine"]},
    "duffing_few": {"polynomial3": ["feature_map=polynomial", "feature_map.degree=3"],
                    "polynomial2": ["feature_map=polynomial", "feature_map.degree=2"],
                    "affine": ["feature_map=affine"]},
    "vdp_few": {"polynomial3": ["feature_map=polynomial", "feature_map.degree=3"],
                "polynomial2": ["feature_map=polynomial", "feature_map.degree=2"]},
    "pendulum_few": {"identity+sin": ["feature_map=combined",
                                      "feature_map.libraries=[identity,sin]"],
                     "polynomial3": ["feature_map=polynomial", "feature_map.degree=3"]},
    "pendulum_het": {"identity+sin": ["feature_map=combined",
                                      "feature_map.libraries=[identity,sin]"]},
    "pendulum": {"identity+sin": ["feature_map=combined", "feature_map.libraries=[identity,sin]"],
                 "affine": ["feature_map=affine"]},
    "lotka_volterra": {"polynomial3": ["feature_map=polynomial", "feature_map.degree=3"],
                       "affine": ["feature_map=affine"]},
}
TRUTH = {"duffing": "polynomial3", "duffing_few": "polynomial3", "vdp_few": "polynomial3",
         "pendulum": "identity+sin", "pendulum_few": "identity+sin",
         "pendulum_het": "identity+sin",
         "lotka_volterra": "polynomial3"}


def run(table, states, inputs, library, folder):
    file = Path(folder) / "fleet.csv"
    if not file.exists():
        table.to_csv(file, index=False)
    over = ["system=generic", "data=files", f"data.path={file}", "strategy=centralized_exact",
            f"data.states=[{','.join(states)}]",
            f"data.inputs=[{','.join(inputs)}]" if inputs else "data.inputs=null",
            "output.plot=false", "progress=false"] + library
    return run_job(over)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--only", default=",".join(FLEETS))
    ap.add_argument("--every", action="store_true",
                    help="run every library on every seed (not only the true one) and count "
                         "each library's verdicts")
    args = ap.parse_args()
    names = args.only.split(",")
    unknown = [n for n in names if n not in FLEETS]
    if unknown:
        ap.error(f"--only: unknown fleet {', '.join(unknown)}; allowed: {', '.join(FLEETS)}")
    if args.seeds < 1:
        ap.error(f"--seeds: {args.seeds} must be at least 1")
    logging.getLogger("fnsysid").setLevel(logging.ERROR)
    for name in names:
        print(f"== {name}")
        seeds = range(args.seeds) if name in TRUTH else range(1)
        counts, why = {}, {}
        for seed in seeds:
            table, states, inputs = FLEETS[name](seed)
            folder = tempfile.TemporaryDirectory()
            for lib, over in LIBRARIES[name].items():
                if seed > 0 and lib != TRUTH.get(name) and not args.every:
                    continue
                res = run(table, states, inputs, over, folder.name)
                mc = res.summary.get("model_check") or {}
                ho = res.summary.get("final_nrmse_sim_mean")
                verdict = mc.get("verdict")
                counts.setdefault(lib, []).append(verdict)
                why.setdefault(lib, []).append(
                    (mc.get("white") is False, bool(mc.get("excess_rejected")),
                     mc.get("free_run_ok") is False))
                if seed == 0:
                    med = (mc.get("nrmse_sim_median") or [None])[0]
                    print(f"  {lib:18s} held-out free-run NRMSE {_g(ho)} (own fits' median "
                          f"{_g(med)})  ok={mc.get('ok')}  verdict={verdict}"
                          f"{_outside(mc)}\n    {verdict_line(mc)}")
            folder.cleanup()
        if args.every and name in TRUTH:
            for lib, v in counts.items():
                if lib != TRUTH[name]:
                    print(f"  {lib} (lacks a true term): verdicts "
                          f"{ {k: int(n) for k, n in pd.Series(v).value_counts().items()} }")
        if name in TRUTH:
            v = counts[TRUTH[name]]
            print(f"  {TRUTH[name]} (holds the truth): 'missing terms' in "
                  f"{sum(x == 'missing terms' for x in v)} of {len(v)} seeds; verdicts "
                  f"{ {k: int(n) for k, n in pd.Series(v).value_counts().items()} }; seeds "
                  f"where the correlation tests reject "
                  f"{sum(w[0] for w in why[TRUTH[name]])}, the held-out excess "
                  f"{sum(w[1] for w in why[TRUTH[name]])}, the free run "
                  f"{sum(w[2] for w in why[TRUTH[name]])}")


def _g(v) -> str:
    """A number of the summary, ``n/a`` where it has none (no client's free run counted)."""
    return "n/a" if v is None else f"{v:.3g}"


def _outside(mc: dict) -> str:
    """The clients whose held-out data go beyond their training data, if any."""
    n = len(mc.get("extrapolating") or [])
    return f"  extrapolating={n}" if n else ""


if __name__ == "__main__":
    main()
