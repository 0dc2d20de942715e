"""Draw one panel from a multirun folder: one curve per swept value (legend ``M=9`` ...).

Usage: python scripts/plot_sweep.py outputs/multirun/<timestamp> [--out fig.png]
       [--metric e_max|e_mean] [--title TEXT]
Writes the figure (PNG and PDF) and a CSV of the final error of every curve.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fnsysid.plotting import METRICS, sweep_figure


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep_dir", type=Path, help="a Hydra multirun folder")
    ap.add_argument("--out", type=Path, default=None,
                    help="figure path (default: <sweep_dir>/sweep.png); a .pdf is written too")
    ap.add_argument("--metric", choices=sorted(METRICS), default="e_max",
                    help="e_max: max over clients (the paper's e_r); e_mean: mean over clients")
    ap.add_argument("--title", default=None)
    args = ap.parse_args(argv)
    if not args.sweep_dir.is_dir():
        print(f"plot_sweep: error: {args.sweep_dir} is not a folder", file=sys.stderr)
        return 2
    out = args.out or args.sweep_dir / "sweep.png"
    try:
        table = sweep_figure(args.sweep_dir, [out.with_suffix(".png"), out.with_suffix(".pdf")],
                             args.metric, args.title)
    except FileNotFoundError as exc:
        print(f"plot_sweep: error: {exc}", file=sys.stderr)
        return 2
    table.to_csv(out.with_suffix(".csv"), index=False)
    print(table.to_string(index=False))
    print(f"wrote {out.with_suffix('.png')}, .pdf and .csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
