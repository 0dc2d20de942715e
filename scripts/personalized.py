"""Personalized models and interval coverage on the synthetic system (``make fig-personalized``).

Usage: python scripts/personalized.py [--repeats 50] [--coverage-repeats 200] [--out figures]

For eps in {0, 0.1, 0.3, 1, 3} (M = 20, N = 10) it runs, through the Python API,
``strategy=centralized_exact personalize=auto`` (pooled least squares, each client's own least
squares and the ``auto`` models) and ``strategy=fedavg`` (the synthetic defaults: K = 5,
lr 1e-4, R = 200), and reports the mean client error ``||theta - theta_i*|| / ||theta_i*||``
of each (mean over repeats, band: 2 standard errors of that mean), and the coverage of the
intervals at level 0.95: pooled (of the clients' mean truth), local and ``auto`` (of each
client's truth), over every (repeat, client, parameter). At eps = 0 the pooled intervals are
also checked over ``--coverage-repeats`` repeats. Writes ``<out>/personalized.csv``, ``.png``
and ``.pdf`` and prints the table and the checks of docs/ALGORITHMS.md.
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


def measure(eps: float, repeats: int) -> list[dict]:
    """Rows (eps, method, quantity, value, band) of one eps."""
    r = fnsysid.run({**BASE, "eps": eps, "repeats": repeats, "strategy": "centralized_exact",
                     "personalize": "auto", "R": 1})
    ce = r.client_estimates
    S, M = repeats, BASE["M"]
    p = len(r.model.param_names)
    truth = ce["truth"].to_numpy().reshape(S, M, p)
    local = ce["local"].to_numpy().reshape(S, M, p)
    z = 1.959963984540054
    last = r.errors[r.errors["round"] == r.errors["round"].max()]
    fed = fnsysid.run({**BASE, "eps": eps, "repeats": repeats})
    fed_last = fed.errors[fed.errors["round"] == fed.errors["round"].max()]
    errs = {
        "local": _client_errors(local, truth),
        "pooled": last["e_mean"].to_numpy(),
        "fedavg": fed_last["e_mean"].to_numpy(),
        "auto": last["e_pers_mean"].to_numpy(),
    }
    rows = [{"eps": eps, "method": k, "quantity": "error", "value": float(v.mean()),
             "band": float(2 * v.std(ddof=1) / np.sqrt(len(v)))} for k, v in errs.items()]
    est = r.estimates
    cover = {
        "pooled": _inside(est["ci_lo"], est["ci_hi"], est["true_mean"]),
        "local": _inside(local - z * ce["local_se"].to_numpy().reshape(S, M, p),
                         local + z * ce["local_se"].to_numpy().reshape(S, M, p), truth),
        "auto": _inside(ce["ci_lo"], ce["ci_hi"], ce["truth"]),
    }
    rows += [{"eps": eps, "method": k, "quantity": "coverage", "value": float(np.mean(v)),
              "band": float(2 * np.sqrt(np.mean(v) * (1 - np.mean(v)) / np.size(v)))}
             for k, v in cover.items()]
    return rows


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

    from fnsysid.results.plotting import method_style

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    x = np.array(EPS)
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
    ap.add_argument("--coverage-repeats", type=int, default=200)
    ap.add_argument("--out", type=Path, default=ROOT / "figures")
    args = ap.parse_args(argv)
    if args.repeats < 20 or args.coverage_repeats < 2:
        ap.error("--repeats must be >= 20 and --coverage-repeats >= 2")
    rows = [row for eps in EPS for row in measure(eps, args.repeats)]
    rows.append(pooled_coverage(args.coverage_repeats))
    table = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "personalized.csv", index=False, float_format="%.6g")
    draw(table, args.out / "personalized")
    err = table[table["quantity"] == "error"].pivot(index="eps", columns="method",
                                                    values="value")
    cov = table[table["quantity"] == "coverage"].pivot(index="eps", columns="method",
                                                       values="value")
    print(err[["local", "pooled", "fedavg", "auto"]].round(4).to_string())
    print(cov.round(4).to_string())
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
          f"{rows[-1]['value']:.4f} (of {int(rows[-1]['band'])} (repeat, parameter) pairs)")
    print(f"wrote {args.out / 'personalized.png'} and .csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
