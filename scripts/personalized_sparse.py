"""``personalize=auto`` on a sparse model's shared support against ``auto`` on every term
(docs/ALGORITHMS.md, "Personalization on a sparse model's support").

For each seed, simulates heterogeneous Duffing fleets (:func:`write_fleet`: ``--M`` clients,
``--N`` training trajectories of ``--T`` samples and one held out, spread of the clients'
parameters ``--eps``, velocity disturbance ``--noise``, ``--repeats`` fleets, the true
coefficients in the library's basis), then identifies them with
``system=generic``, a degree-3 polynomial library (40 terms), ``strategy=centralized_exact``
and ``personalize=auto``, once on every term and once with ``sparsity=stlsq`` (the server's
pooled support, each client's own values on it). Prints, per seed, the mean over repeats and
clients of each client's relative parameter error ``||theta_i - theta_i*|| / ||theta_i*||``
of the personalized models and of the clients' own least squares (``local``), the share of
repeats whose support is exactly the true 6 terms, and the coverage of the 95 % intervals of
the personalized models (kept terms; every term without sparsity).

    python scripts/personalized_sparse.py [--seeds 3] [--M 20] [--N 2] [--eps 0.2]
        [--noise 0.5] [--repeats 10]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TRUE = {"x1+:x1", "x1+:x2", "x2+:x1", "x2+:x2", "x2+:u", "x2+:x1^3"}
GENERIC = ["system=generic", "data=files", "data.states=[x1,x2]", "data.inputs=[u]",
           "feature_map=polynomial", "feature_map.degree=3", "strategy=centralized_exact",
           "personalize=auto", "output.plot=false", "progress=false"]


def scores(res) -> dict:
    """Mean client error of the personalized and local models, coverage, support recovery."""
    ce = res.tables["client_estimates"]
    out = {}
    for col, name in (("estimate", "auto"), ("local", "local")):
        d = ce.assign(err=(ce[col] - ce["truth"]) ** 2, ref=ce["truth"] ** 2)
        g = d.groupby(["repeat", "client"])[["err", "ref"]].sum()
        out[name] = float(np.sqrt(g["err"] / g["ref"]).mean())
    has = ce["se"].notna()
    inside = (ce["ci_lo"] <= ce["truth"]) & (ce["truth"] <= ce["ci_hi"])
    out["coverage"] = float(inside[has].mean())
    est = res.estimates
    kept = est[est["estimate"] != 0].groupby("repeat")["parameter"].agg(set)
    out["exact_support"] = float((kept == TRUE).mean())
    return out


DT, DELTA, B = 0.05, 0.3, 1.0


def write_fleet(path: Path, rng, M: int, N: int, T: int, eps: float, noise: float,
                repeats: int) -> dict:
    """A CSV of ``repeats`` fleets of M Duffing oscillators (forward Euler, dt 0.05, damping
    0.3, input gain 1; ``alpha = 1 + eps z``, ``beta = 0.5 (1 + eps z')`` per client, z, z'
    standard normal), N training and 1 held-out trajectory of T samples a client, velocity
    disturbance ``noise``; returns each (repeat, client)'s true coefficients by name."""
    rows, truth = [], {}
    for r in range(repeats):
        for c in range(M):
            alpha, beta = 1.0 + eps * rng.normal(), 0.5 * (1.0 + eps * rng.normal())
            truth[r, f"c{c:02d}"] = {"x1+:x1": 1.0, "x1+:x2": DT, "x2+:x1": -DT * alpha,
                                     "x2+:x2": 1.0 - DT * DELTA, "x2+:u": DT * B,
                                     "x2+:x1^3": -DT * beta}
            for j in range(N + 1):
                x, u = np.empty((T + 1, 2)), rng.normal(size=T + 1)
                x[0] = rng.normal(size=2)
                for t in range(T):
                    x[t + 1, 0] = x[t, 0] + DT * x[t, 1]
                    x[t + 1, 1] = x[t, 1] + DT * (-DELTA * x[t, 1] - alpha * x[t, 0]
                                                  - beta * x[t, 0] ** 3 + B * u[t]
                                                  + noise * rng.normal())
                rows += [(r, f"c{c:02d}", j, t, *x[t], u[t]) for t in range(T + 1)]
    import pandas as pd

    pd.DataFrame(rows, columns=["repeat", "client", "trajectory", "t", "x1", "x2", "u"]
                 ).to_csv(path, index=False)
    return truth


def main(argv=None) -> None:
    import pandas as pd

    import fnsysid

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--M", type=int, default=20)
    ap.add_argument("--N", type=int, default=2)
    ap.add_argument("--T", type=int, default=50)
    ap.add_argument("--eps", type=float, default=0.2)
    ap.add_argument("--noise", type=float, default=0.5)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            rng = np.random.default_rng(seed)
            file, tfile = Path(tmp) / f"fleet{seed}.csv", Path(tmp) / f"truth{seed}.csv"
            truth = write_fleet(file, rng, args.M, args.N, args.T, args.eps, args.noise,
                                args.repeats)
            names = fnsysid.run([*GENERIC, f"data.path={file}", "personalize=none",
                                 "output.model_check=false"]).model.param_names
            pd.DataFrame([(r, c, n, v.get(n, 0.0)) for (r, c), v in truth.items()
                          for n in names],
                         columns=["repeat", "client", "parameter", "value"]).to_csv(
                tfile, index=False)
            data = [f"data.path={file}", f"data.truth={tfile}"]
            dense = scores(fnsysid.run([*GENERIC, *data]))
            sparse = scores(fnsysid.run([*GENERIC, *data, "sparsity=stlsq"]))
            print(f"seed {seed}: error auto dense {dense['auto']:.4f}, auto on the support "
                  f"{sparse['auto']:.4f}, local {dense['local']:.4f} (local on the support "
                  f"{sparse['local']:.4f}); coverage dense {dense['coverage']:.3f}, on the "
                  f"support {sparse['coverage']:.3f}; exact support "
                  f"{sparse['exact_support']:.2f}", flush=True)


if __name__ == "__main__":
    main()
