"""Build the figures of scripts/figures.yaml: run their experiments, then draw them.

Usage: python scripts/make_figure.py NAME [NAME ...] | --all   [--plot-only] [--out figures]
       [--sweeps outputs/sweeps] [--override KEY=VALUE ...]

Each experiment (conf/experiment/<name>.yaml, a Hydra multirun) runs once per invocation into
outputs/sweeps/<name>/ (cleared first). Each figure is written as <out>/<NAME>.png and .pdf,
with <out>/<NAME>.csv holding the final error of every curve (mean and std over repeats).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

from fnsysid.plotting import figure, read_sweep

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = Path(__file__).with_name("figures.yaml")
SWEEPS = ROOT / "outputs" / "sweeps"
#: overrides of every experiment run here: quiet, no per-job plots (the figure is the product)
RUN_OVERRIDES = ["progress=false", "output.plot=false"]


def load_registry() -> dict:
    return yaml.safe_load(REGISTRY.read_text())


def run_experiment(name: str, sweeps: Path, extra: list[str]) -> float:
    """Run one experiment's sweep from scratch into ``sweeps/name``; return its wall time."""
    import shutil

    shutil.rmtree(sweeps / name, ignore_errors=True)
    t0 = time.perf_counter()
    cmd = [sys.executable, str(ROOT / "run.py"), f"experiment={name}",
           f"hydra.sweep.dir={sweeps / name}", *RUN_OVERRIDES, *extra]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if res.returncode != 0:
        sys.stderr.write(res.stdout[-2000:] + res.stderr[-4000:])
        raise SystemExit(f"make_figure: experiment {name} failed (exit {res.returncode})")
    return time.perf_counter() - t0


def draw(name: str, spec: dict, out: Path, sweeps: Path) -> pd.DataFrame:
    panels = []
    for p in spec["panels"]:
        sweep = sweeps / p["experiment"]
        panels.append({**p, "dir": sweep, "where": p.get("where") or {}})
    table = figure(panels, out / name, suptitle=spec.get("paper"), ncols=spec.get("ncols"))
    table.insert(0, "figure", name)
    table.to_csv((out / name).with_suffix(".csv"), index=False, float_format="%.4g")
    return table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="figure names (keys of scripts/figures.yaml)")
    ap.add_argument("--all", action="store_true", help="every figure")
    ap.add_argument("--plot-only", action="store_true", help="redraw from existing sweeps")
    ap.add_argument("--out", type=Path, default=ROOT / "figures")
    ap.add_argument("--sweeps", type=Path, default=SWEEPS, help="where experiments write")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="extra override for every experiment (e.g. R=2 for a smoke run)")
    args = ap.parse_args(argv)
    registry = load_registry()
    names = list(registry) if args.all else args.names
    unknown = [n for n in names if n not in registry]
    if not names or unknown:
        print(f"make_figure: error: unknown or no figure {', '.join(unknown)}; allowed: "
              f"{', '.join(registry)}", file=sys.stderr)
        return 2
    experiments = list(dict.fromkeys(p["experiment"] for n in names
                                     for p in registry[n]["panels"]))
    if not args.plot_only:
        for e in experiments:
            print(f"running experiment {e} ... ", end="", flush=True)
            print(f"{run_experiment(e, args.sweeps, args.override):.1f} s", flush=True)
    missing = [e for e in experiments if not read_sweep(args.sweeps / e)]
    if missing:
        print(f"make_figure: error: no results for {', '.join(missing)}; run without "
              "--plot-only", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for n in names:
        table = draw(n, registry[n], args.out, args.sweeps)
        print(f"wrote {args.out / n}.png/.pdf/.csv ({len(table)} curves)")
        slopes = [c for c in table.columns if c.startswith("slope_vs_")]
        if slopes and table[slopes].notna().any().any():
            print(table[["panel", "series", *slopes]].drop_duplicates()
                  .to_string(index=False, float_format="%.3f"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
