"""Wall time of ``runtime=flower`` against ``runtime=inprocess`` (docs/FEDERATED.md).

    python scripts/flower_overhead.py [--M 4 16 64] [--R 20] [run.py overrides ...]

Runs the same experiment both ways for each M, checks that the per-round errors agree to
1e-10, and prints a Markdown table (also written to ``--out``, default
``outputs/flower_overhead.csv``). Needs the ``flower`` extra.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

DEFAULT = ["system=synthetic", "repeats=5", "strategy=fedavg"]


def main(argv=None) -> pd.DataFrame:
    import fnsysid
    from fnsysid.runtimes.check import INSTALL_FLOWER, flower_installed

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--M", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--R", type=int, default=20)
    ap.add_argument("--out", default="outputs/flower_overhead.csv")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    if not flower_installed():
        raise SystemExit(f"flower_overhead: Flower is not installed: {INSTALL_FLOWER}")
    rows = []
    for M in args.M:
        base = [*(args.overrides or DEFAULT), f"M={M}", f"R={args.R}", "output.plot=false"]
        timing, errors = {}, {}
        for runtime in ("inprocess", "flower"):
            t0 = time.perf_counter()
            res = fnsysid.run([*base, f"runtime={runtime}"])
            timing[runtime] = time.perf_counter() - t0
            errors[runtime] = res.errors
        diff = float(np.abs(errors["flower"]["e_max"] - errors["inprocess"]["e_max"]).max())
        if not diff <= 1e-10:
            raise SystemExit(f"M={M}: flower and in-process differ by {diff:.2e}")
        rows.append({"M": M, "R": args.R, "inprocess_s": round(timing["inprocess"], 2),
                     "flower_s": round(timing["flower"], 2),
                     "ratio": round(timing["flower"] / timing["inprocess"], 1),
                     "flower_per_round_s": round(timing["flower"] / args.R, 3),
                     "max_abs_diff_e_max": diff})
    df = pd.DataFrame(rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out, index=False)
    print("| M | R | in process (s) | flower (s) | ratio | flower per round (s) | max diff |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['M']} | {r['R']} | {r['inprocess_s']} | {r['flower_s']} | {r['ratio']} | "
              f"{r['flower_per_round_s']} | {r['max_abs_diff_e_max']:.1e} |")
    return df


if __name__ == "__main__":
    main()
