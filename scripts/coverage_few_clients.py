"""Coverage of ``personalize=auto``'s intervals against the number of clients (docs/ALGORITHMS.md,
*Few clients*).

Usage: ``python scripts/coverage_few_clients.py [--M 10,20,30] [--seeds 8] [--eps 0.3]``

Each seed writes a Duffing fleet of ``M`` clients to a temporary folder, one CSV file a client
(6 runs of 100 samples, ``dt = 0.05``): ``x1+ = x1 + dt x2``, ``x2+ = x2 + dt (-k x1 - c x2 -
b x1^3 + u) + 0.1 sqrt(dt) w``, with ``k``, ``c``, ``b`` drawn uniformly within ``eps`` of 1,
0.2 and 1 (relative) for each client, the input gain 1 on every client, ``u`` and ``w``
standard normal. It fits ``FederatedSysID(feature_map="polynomial", degree 3,
sparsity="stlsq", strategy="centralized_exact", personalize="auto")`` and counts, over the
four true coefficients of ``x2+`` of every client, how often the 95 % interval of
``client_estimates.csv`` holds the client's truth: ``auto`` (``ci_lo``, ``ci_hi``) and the
client's own least squares (``local_lo``, ``local_hi``). A fleet whose simulation escapes to
infinity is refused by the run and left out, as is one whose support (the pooled STLSQ's)
misses a true term: the kept terms then carry its effect, a bias no interval holds (both
named).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

import fnsysid

DT = 0.05


def fleet(folder: Path, M: int, eps: float, seed: int) -> dict:
    """Write the fleet's files; each client's true coefficients of ``x2+`` by parameter name."""
    rng = np.random.default_rng(seed)
    truth = {}
    for c in range(M):
        k, damp, b = (v * (1 + eps * rng.uniform(-1, 1)) for v in (1.0, 0.2, 1.0))
        truth[f"c{c:02d}"] = {"x2+:x1": -DT * k, "x2+:x2": 1 - DT * damp, "x2+:u": DT,
                              "x2+:x1^3": -DT * b}
        rows = []
        for r in range(6):
            x1, x2 = rng.normal(size=2)
            for t in range(100):
                u = rng.normal()
                rows.append((r, round(t * DT, 6), x1, x2, u))
                x1, x2 = (x1 + DT * x2, x2 + DT * (-k * x1 - damp * x2 - b * x1 ** 3 + u)
                          + 0.1 * np.sqrt(DT) * rng.normal())
        pd.DataFrame(rows, columns=["run", "time", "x1", "x2", "u"]).to_csv(
            folder / f"c{c:02d}.csv", index=False)
    return truth


def coverage(M: int, eps: float, seeds: int) -> dict:
    """Intervals holding the truth, auto and local, over the seeds' fleets."""
    hit, local_hit, used = [], [], []
    for seed in range(seeds):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "fleet"
            folder.mkdir()
            truth = fleet(folder, M, eps, seed)
            m = fnsysid.FederatedSysID(feature_map="polynomial", sparsity="stlsq",
                                       strategy="centralized_exact", personalize="auto",
                                       progress=False, config={"feature_map.degree": 3},
                                       output_dir=Path(tmp) / "run")
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    m.fit(folder, states=["x1", "x2"], inputs=["u"], trajectory="run",
                          time="time")
            except fnsysid.ConfigError as exc:
                print(f"  seed {seed} left out: {str(exc)[:100]}")
                continue
            est = pd.read_csv(Path(tmp) / "run" / "client_estimates.csv")
        true = est[est["parameter"].isin(next(iter(truth.values())))]
        if true["estimate"].isna().all():       # auto broke down (its warning says so)
            print(f"  seed {seed} left out: no personalized models")
            continue
        if true["ci_lo"].isna().any():          # the support left out a true term
            print(f"  seed {seed} left out: the support misses a true term of x2+")
            continue
        used.append(seed)
        for r in est.itertuples():
            t = truth[str(r.client)].get(r.parameter)
            if t is None or np.isnan(r.ci_lo):
                continue
            hit.append(r.ci_lo <= t <= r.ci_hi)
            local_hit.append(r.local_lo <= t <= r.local_hi)
    return {"M": M, "fleets": len(used), "intervals": len(hit),
            "auto": float(np.mean(hit)), "local": float(np.mean(local_hit))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--M", default="10,20,30", help="clients, comma-separated")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--eps", type=float, default=0.3)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    print("M   fleets  intervals  auto   local")
    for M in (int(v) for v in args.M.split(",")):
        c = coverage(M, args.eps, args.seeds)
        print(f"{c['M']:<4}{c['fleets']:<8}{c['intervals']:<11}{c['auto']:.3f}  {c['local']:.3f}",
              flush=True)


if __name__ == "__main__":
    main()
