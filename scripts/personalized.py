"""Personalized models and interval coverage on the synthetic system (``make fig-personalized``).

Usage: python scripts/personalized.py [--repeats 50] [--seeds 3] [--coverage-repeats 200]
[--eps 0,0.1,0.3,1,3] [--out figures]

For eps in {0, 0.1, 0.3, 1, 3} (M = 20, N = 10) it runs, through the Python API,
``strategy=centralized_exact personalize=auto`` (pooled least squares, each client's own least
squares and the ``auto`` models) and ``strategy=fedavg`` (the synthetic defaults: K = 5,
lr 1e-4, R = 200), and reports the mean client error ``||theta - theta_i*|| / ||theta_i*||``
of each, and the coverage of the intervals at level 0.95: pooled (of the clients' mean truth),
local (``local_lo``, ``local_hi``: Student's t) and ``auto`` (of each client's truth), over
every (repeat, client, parameter). Each quantity is measured on ``--seeds`` seeds (``seed`` 0,
1, ...); the value is their mean and the band 2 standard errors of that mean from the spread
over seeds (the (repeat, client, parameter) triples of one seed are correlated, so a binomial
band over them is too narrow); the range over seeds is printed. At eps = 0 the pooled
intervals are also checked over ``--coverage-repeats`` repeats. Writes
``<out>/personalized.csv``, ``.png`` and ``.pdf`` and prints the table and the checks of
docs/ALGORITHMS.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

import fnsysid

ROOT = Path(__file__).resolve().parent.parent
EPS = (0.0, 0.1, 0.3, 1.0, 3.0)
BASE = {"system": "synthetic", "M": 20, "N": 10, "progress": False, "output.plot": False}


def _client_errors(est: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Mean over clients of the relative error, per repeat: est, truth (S, M, p)."""
    return (np.linalg.norm(est - truth, axis=-1) / np.linalg.norm(truth, axis=-1)).mean(axis=1)


def _inside(lo, hi, truth) -> np.ndarray:
    return (np.asarray(lo) <= np.asarray(truth)) & (np.asarray(truth) <= np.asarray(hi))


def measure(eps: float, repeats: int, seed: int = 0) -> list[dict]:
    """Rows (eps, method, quantity, value) of one eps and seed."""
    r = fnsysid.run({**BASE, "eps": eps, "repeats": repeats, "strategy": "centralized_exact",
                     "personalize": "auto", "R": 1, "seed": seed})
    ce = r.client_estimates
    S, M = repeats, BASE["M"]
    p = len(r.model.param_names)
    truth = ce["truth"].to_numpy().reshape(S, M, p)
    local = ce["local"].to_numpy().reshape(S, M, p)
    last = r.errors[r.errors["round"] == r.errors["round"].max()]
    fed = fnsysid.run({**BASE, "eps": eps, "repeats": repeats, "seed": seed})
    fed_last = fed.errors[fed.errors["round"] == fed.errors["round"].max()]
    errs = {
        "local": _client_errors(local, truth),
        "pooled": last["e_mean"].to_numpy(),
        "fedavg": fed_last["e_mean"].to_numpy(),
        "auto": last["e_pers_mean"].to_numpy(),
    }
    rows = [{"eps": eps, "method": k, "quantity": "error", "value": float(v.mean())}
            for k, v in errs.items()]
    est = r.estimates
    cover = {
        "pooled": _inside(est["ci_lo"], est["ci_hi"], est["true_mean"]),
        "local": _inside(ce["local_lo"], ce["local_hi"], ce["truth"]),
        "auto": _inside(ce["ci_lo"], ce["ci_hi"], ce["truth"]),
    }
    rows += [{"eps": eps, "method": k, "quantity": "coverage", "value": float(np.mean(v))}
             for k, v in cover.items()]
    return rows


def over_seeds(rows: list[dict]) -> pd.DataFrame:
    """Rows of several seeds -> one row per (eps, method, quantity): the mean over seeds,
    ``band`` 2 standard errors of it from their spread, ``lo`` and ``hi`` their range."""
    g = pd.DataFrame(rows).groupby(["eps", "method", "quantity"], sort=False)["value"]
    out = g.agg(["mean", "std", "count", "min", "max"]).reset_index()
    out["band"] = 2 * out["std"] / np.sqrt(out["count"])
    return out.rename(columns={"mean": "value", "min": "lo", "max": "hi", "count": "seeds"})[
        ["eps", "method", "quantity", "value", "band", "lo", "hi", "seeds"]]


def pooled_coverage(repeats: int) -> dict:
    """Coverage of the pooled intervals at eps = 0 over (repeat, parameter) pairs."""
    r = fnsysid.run({**BASE, "eps": 0.0, "repeats": repeats, "strategy": "centralized_exact",
                     "R": 1})
    est = r.estimates
    inside = _inside(est["ci_lo"], est["ci_hi"], est["true_mean"])
    return {"eps": 0.0, "method": f"pooled ({repeats} repeats)", "quantity": "coverage",
            "value": float(inside.mean()), "band": float(len(inside))}


def draw(table: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fnsysid.results.plotting.style import method_style

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    x = np.array(sorted(table.loc[table["seeds"].notna(), "eps"].unique()))
    xs = np.where(x == 0, 0.03, x)          # eps = 0 drawn at the left edge of the log axis
    methods = {"local": "local", "pooled": "centralized_exact", "fedavg": "fedavg",
               "auto": "personalized"}      # the table's names -> the look of every figure
    for method, look in methods.items():
        style = {**method_style(look), "marker": "o"}
        color = style["color"]
        t = table[(table["quantity"] == "error") & (table["method"] == method)]
        ax1.plot(xs, t["value"], **style)
        ax1.fill_between(xs, t["value"] - t["band"], t["value"] + t["band"], color=color,
                         alpha=0.2)
        if method == "fedavg":
            continue
        t = table[(table["quantity"] == "coverage") & (table["method"] == method)]
        ax2.plot(xs, t["value"], **style)
        ax2.fill_between(xs, t["value"] - t["band"], t["value"] + t["band"], color=color,
                         alpha=0.2)
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_xticks(xs, ["0"] + [f"{v:g}" for v in x[1:]])
        ax.set_xlabel("heterogeneity \u03b5")
        ax.legend(fontsize=8)
    ax1.set_ylabel(r"mean client error $\|\theta - \theta_i^*\| / \|\theta_i^*\|$")
    ax1.set_title("(a) final error", fontsize=9)
    ax2.axhline(0.95, color="k", lw=0.8, ls="--")
    ax2.set_ylabel("coverage of the 95 % intervals")
    ax2.set_title("(b) coverage", fontsize=9)
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=120)
    fig.savefig(path.with_suffix(".pdf"))
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--eps", default=",".join(f"{e:g}" for e in EPS))
    ap.add_argument("--coverage-repeats", type=int, default=200)
    ap.add_argument("--out", type=Path, default=ROOT / "figures")
    args = ap.parse_args(argv)
    if args.repeats < 20 or args.coverage_repeats < 2 or args.seeds < 2:
        ap.error("--repeats must be >= 20, --seeds >= 2 and --coverage-repeats >= 2")
    try:
        eps_list = tuple(float(e) for e in args.eps.split(","))
    except ValueError:
        ap.error(f"--eps must be numbers separated by commas, not {args.eps!r}")
    rows = [row for eps in eps_list for seed in range(args.seeds)
            for row in measure(eps, args.repeats, seed)]
    pooled_row = pooled_coverage(args.coverage_repeats)
    table = pd.concat([over_seeds(rows), pd.DataFrame([pooled_row])], ignore_index=True)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "personalized.csv", index=False, float_format="%.6g")
    draw(table, args.out / "personalized")
    err = table[table["quantity"] == "error"].pivot(index="eps", columns="method",
                                                    values="value")
    cov = table[table["quantity"] == "coverage"].pivot(index="eps", columns="method",
                                                       values="value")
    print(err[["local", "pooled", "fedavg", "auto"]].round(4).to_string())
    print(cov.round(4).to_string())
    seeds = table[table["seeds"].notna()]
    print(f"range over {args.seeds} seeds:")
    print(seeds[["eps", "method", "quantity", "lo", "hi"]].round(4).to_string(index=False))
    best = err[["local", "pooled"]].min(axis=1)
    ok_close = (err["auto"] <= 1.10 * best)
    ok_below = (err["auto"] <= 0.75 * best)[err.index >= 1]
    print("auto within 10 % of the better of local and pooled:",
          ", ".join(f"eps={e:g}: {'yes' if v else 'no'} ({a / b - 1:+.1%})"
                    for e, v, a, b in zip(err.index, ok_close, err["auto"], best,
                                          strict=True)))
    print("auto at least 25 % below both at eps >= 1:",
          ", ".join(f"eps={e:g}: {'yes' if v else 'no'}" for e, v in ok_below.items()))
    print(f"pooled coverage at eps=0 over {args.coverage_repeats} repeats: "
          f"{pooled_row['value']:.4f} (of {int(pooled_row['band'])} (repeat, parameter) pairs)")
    print(f"wrote {args.out / 'personalized.png'} and .csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
