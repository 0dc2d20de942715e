"""Final error against the privacy budget epsilon (``make fig-privacy``, docs/PRIVACY.md).

Usage: python scripts/privacy_figure.py [--M 1000,10000,100000,1000000]
[--epsilon 0.3,1,3,10] [--repeats 3] [--big-repeats 1] [--out figures] [--resume]

For each M and each strategy it runs, through the Python API, ``system=synthetic eps=0
data.val_N=0`` (no heterogeneity, so the error measured is estimation error; only training data
drawn) without privacy and with ``privacy=central privacy.delta=1e-7`` (below 1/M at every M
drawn, as delta should be) at each epsilon, and
records the mean over repeats of the final relative error ``e_R`` (``final_e_max_mean``):

- ``oneshot``: the mean of the clients' own least-squares estimates, each clipped to norm
  ``privacy.clip=3`` (the nominal model's norm is 2.37; at M = 10^4, 0.2 % of the clients'
  estimates are longer), one release;
- ``fedavg``: DP-FedAvg, each round's model change clipped to ``privacy.clip=0.15`` and the
  rounds composed by the accountant; ``lr=1e-3 R=50`` (the synthetic defaults lr 1e-4 and
  R = 200 do not converge: e 0.022 against 0.0028 at M = 10^4 without privacy; lr 1e-3
  converges by round 50: 0.0030).

M >= 10^6 runs ``--big-repeats`` repeats (memory and time). A run whose status is not ``ok``
(diverged, growing, ill-conditioned) is listed with its status and left out of the figure.
Writes ``<out>/privacy.csv`` (one row per strategy, M, epsilon; epsilon empty for the
non-private run) after each run, so that ``--resume`` goes on from where an interrupted
invocation stopped, then ``.png`` and ``.pdf``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

import fnsysid

ROOT = Path(__file__).resolve().parent.parent
DELTA = 1e-7
BASE = {"system": "synthetic", "eps": 0.0, "data.val_N": 0, "progress": False,
        "output.plot": False, "output.model_check": False}
#: each strategy's own settings (module docstring) and its bound on one contribution
STRATEGIES = {
    "oneshot": ({"strategy": "oneshot"}, 3.0),
    "fedavg": ({"strategy": "fedavg", "lr": 1e-3, "R": 50}, 0.15),
}


def one(strategy: str, M: int, repeats: int, epsilon: float | None, seed: int) -> dict:
    """One run: its final error and, with privacy, what the mechanism reports."""
    settings, clip = STRATEGIES[strategy]
    over = {**BASE, **settings, "M": M, "repeats": repeats, "seed": seed}
    if epsilon is not None:
        over.update({"privacy": "central", "privacy.epsilon": epsilon,
                     "privacy.delta": DELTA, "privacy.clip": clip})
    t0 = time.perf_counter()
    r = fnsysid.run(over)
    s = r.summary
    p = s.get("privacy") or {}
    return {"strategy": strategy, "M": M, "epsilon": epsilon, "repeats": repeats,
            "status": s["status"], "error": s.get("final_e_max_mean"),
            "spent_epsilon": p.get("epsilon"), "noise_multiplier": p.get("noise_multiplier"),
            "clip": p.get("clip"), "clipped_fraction": p.get("clipped_fraction"),
            "rounds": p.get("rounds"), "seconds": round(time.perf_counter() - t0, 2)}


def draw(table: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = table[table["status"] == "ok"]
    Ms = sorted(table["M"].unique())
    colors = plt.cm.viridis(np.linspace(0.0, 0.85, len(Ms)))
    fig, axes = plt.subplots(1, len(STRATEGIES), figsize=(5 * len(STRATEGIES), 4),
                             sharey=True)
    titles = {"oneshot": "(a) oneshot: clients' own fits, one release",
              "fedavg": "(b) DP-FedAvg: lr 1e-3, R = 50 rounds"}
    for ax, strategy in zip(np.atleast_1d(axes), STRATEGIES, strict=True):
        for M, color in zip(Ms, colors, strict=True):
            t = ok[(ok["strategy"] == strategy) & (ok["M"] == M)]
            priv = t[t["epsilon"].notna()].sort_values("epsilon")
            plain = t[t["epsilon"].isna()]
            label = f"M = 10^{int(round(np.log10(M)))}" if M > 0 else f"M = {M}"
            if len(priv):
                ax.plot(priv["epsilon"], priv["error"], "o-", color=color, label=label)
            if len(plain):
                ax.axhline(float(plain["error"].iloc[0]), color=color, ls="--", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(r"privacy budget $\varepsilon$ ($\delta = 10^{-7}$)")
        ax.set_title(titles[strategy], fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    first = np.atleast_1d(axes)[0]
    first.set_ylabel(r"final error $e_R$ (dashed: without privacy)")
    first.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=120)
    fig.savefig(path.with_suffix(".pdf"))
    plt.close(fig)


def _numbers(text: str, kind, what: str, ap) -> list:
    try:
        values = [kind(float(v)) for v in text.split(",")]
    except ValueError:
        ap.error(f"{what} must be numbers separated by commas, not {text!r}")
    if not values or min(values) <= 0:
        ap.error(f"{what} must be positive, not {text!r}")
    return values


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--M", default="1000,10000,100000,1000000")
    ap.add_argument("--epsilon", default="0.3,1,3,10")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--big-repeats", type=int, default=1, help="repeats at M >= 10^6")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "figures")
    ap.add_argument("--resume", action="store_true",
                    help="keep the runs already in <out>/privacy.csv (it is written after "
                         "each run) and run only the others")
    args = ap.parse_args(argv)
    Ms = _numbers(args.M, int, "--M", ap)
    epsilons = _numbers(args.epsilon, float, "--epsilon", ap)
    if args.repeats < 1 or args.big_repeats < 1:
        ap.error("--repeats and --big-repeats must be at least 1")
    args.out.mkdir(parents=True, exist_ok=True)
    csv = args.out / "privacy.csv"
    done = pd.read_csv(csv) if args.resume and csv.exists() else pd.DataFrame()
    rows = done.to_dict("records")

    def finished(strategy, M, epsilon) -> bool:
        if done.empty:
            return False
        same = (done["strategy"] == strategy) & (done["M"] == M)
        eps = done["epsilon"].isna() if epsilon is None else np.isclose(done["epsilon"],
                                                                          epsilon)
        return bool((same & eps).any())

    for M in Ms:
        repeats = args.big_repeats if M >= 1_000_000 else args.repeats
        for strategy in STRATEGIES:
            for epsilon in [None, *epsilons]:
                if finished(strategy, M, epsilon):
                    continue
                row = one(strategy, M, repeats, epsilon, args.seed)
                rows.append(row)
                pd.DataFrame(rows).to_csv(csv, index=False, float_format="%.6g")
                eps_text = "none" if epsilon is None else f"{epsilon:g}"
                print(f"{strategy:>8} M={M:>8} epsilon={eps_text:>5} {row['status']:>8} "
                      f"e={row['error']:.4g} z={row['noise_multiplier'] or 0:.3g} "
                      f"clipped={row['clipped_fraction'] or 0:.3f} {row['seconds']:.1f} s",
                      flush=True)
    table = pd.DataFrame(rows)
    draw(table, args.out / "privacy")
    bad = table[table["status"] != "ok"]
    for _, r in bad.iterrows():
        print(f"not drawn: {r['strategy']} M={r['M']} epsilon={r['epsilon']}: {r['status']}")
    print(f"wrote {args.out / 'privacy.png'} and .csv")
    return 1 if len(bad) else 0


if __name__ == "__main__":
    sys.exit(main())
