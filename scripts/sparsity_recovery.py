"""Support recovery of ``sparsity=stlsq`` against noise level and number of clients (README).

    python scripts/sparsity_recovery.py [--noise 0.05 0.5 2 5] [--M 1 2 5 20] [--N 2] [--repeats 10]
        [--strategies fedavg centralized_exact] [--threshold 0.05 auto] [--eps 0.2] [--seed 0]

For each noise level (the Duffing fleet's velocity disturbance, ``system.disturbance.scale``)
and number of clients M, simulates a Duffing fleet (examples/duffing, ``--N`` = 2 trajectories of
T = 50 samples a client, ``--eps`` = 0.2 the spread of the clients' parameters, ``repeats``
independent fleets), then identifies it with ``system=generic``, a degree-3 polynomial
library (40 terms) and ``sparsity=stlsq``, with each of ``--strategies`` (R = 50;
``centralized_exact`` is pooled STLSQ) at each of ``--threshold`` (``sparsity.threshold``:
numbers; ``auto``, the threshold chosen by held-out error; or ``auto-bic``, ``auto`` on the
training trajectories alone, so that it falls back to BIC on the same training data; with more
than one, the columns are named ``<strategy>@<threshold>``).
Prints a Markdown table of the share of repeats whose kept terms are exactly the true 6 and
the mean number of kept terms; writes it to ``--out`` (default ``outputs/sparsity_recovery.csv``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
TRUE = {"x1+:x1", "x1+:x2", "x2+:x1", "x2+:x2", "x2+:u", "x2+:x1^3"}
GENERIC = ["system=generic", "data=files", "data.states=[x1,x2]", "data.inputs=[u]",
           "feature_map=polynomial", "feature_map.degree=3", "sparsity=stlsq",
           "output.plot=false", "progress=false"]


def recovery(estimates: pd.DataFrame) -> tuple[float, float]:
    """Share of repeats whose non-zero coefficients are exactly :data:`TRUE`, and the mean
    number of non-zero coefficients."""
    kept = estimates[estimates["estimate"] != 0].groupby("repeat")["parameter"].agg(set)
    kept = kept.reindex(sorted(estimates["repeat"].unique()), fill_value=set())
    return float((kept == TRUE).mean()), float(kept.map(len).mean())


def main(argv=None) -> pd.DataFrame:
    import fnsysid

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--noise", type=float, nargs="+", default=[0.05, 0.5, 2.0, 5.0])
    ap.add_argument("--M", type=int, nargs="+", default=[1, 2, 5, 20])
    ap.add_argument("--N", type=int, default=2, help="trajectories per client")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--strategies", nargs="+", default=["fedavg", "centralized_exact"])
    ap.add_argument("--threshold", nargs="+", default=["0.05"],
                    help="sparsity.threshold values (numbers or auto), each its own columns")
    ap.add_argument("--eps", type=float, default=0.2,
                    help="spread of the clients' parameters (eps; 0: identical clients)")
    ap.add_argument("--seed", type=int, default=0, help="root seed of the simulated fleets")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="more overrides of the identification runs, e.g. sparsity.margin=2")
    ap.add_argument("--out", default="outputs/sparsity_recovery.csv")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "examples" / "duffing"))           # the Duffing class
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for noise in args.noise:
            for M in args.M:
                sim = Path(tmp) / f"sim_{noise}_{M}"
                fnsysid.run(["system=duffing", f"M={M}", f"N={args.N}", f"repeats={args.repeats}",
                             "R=1", f"seed={args.seed}", f"eps={args.eps}",
                             f"system.disturbance.scale={noise}", "output.trajectories=true",
                             "output.plot=false", "progress=false"],
                            output_dir=sim, config_dir=ROOT / "examples" / "duffing" / "conf")
                row = {"noise": noise, "M": M}
                for strategy, threshold in [(s, t) for s in args.strategies
                                            for t in args.threshold]:
                    name = strategy if len(args.threshold) == 1 else f"{strategy}@{threshold}"
                    path = sim / "trajectories.parquet"
                    if threshold == "auto-bic":         # the same training data, none held out
                        path = sim / "train_only.parquet"
                        if not path.exists():
                            df = pd.read_parquet(sim / "trajectories.parquet")
                            df[df["split"] == "train"].to_parquet(path, index=False)
                    try:
                        res = fnsysid.run([*GENERIC, f"data.path={path}", f"strategy={strategy}",
                                           "R=50", *args.set, "sparsity.threshold="
                                           + ("auto" if threshold == "auto-bic" else threshold)])
                    except fnsysid.ConfigError:         # refused before the run
                        row[f"{name}_exact"], row[f"{name}_terms"] = 0.0, float("nan")
                        row[f"{name}_status"] = "refused"
                        continue
                    if res.estimates is None:           # no estimate (diverged): none found
                        row[f"{name}_exact"], row[f"{name}_terms"] = 0.0, float("nan")
                    else:
                        row[f"{name}_exact"], row[f"{name}_terms"] = recovery(res.estimates)
                    row[f"{name}_status"] = res.summary["status"]
                    if threshold.startswith("auto"):    # how it chose: the rule, the thresholds
                        sp = res.summary["sparsity"]
                        row[f"{name}_rule"] = sp["rule"]
                        row[f"{name}_threshold"] = float(np.median(sp["threshold"]))
                rows.append(row)
                print(row, flush=True)
    table = pd.DataFrame(rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False)
    print(table.to_markdown(index=False, floatfmt=".2f") if _has_tabulate() else table)
    return table


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
