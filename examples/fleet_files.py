"""A small fleet's files for trying a Flower deployment (docs/FEDERATED.md) on one machine.

Simulates ``--clients`` clients of the synthetic system (fnsysid's own simulator) and writes
each client's trajectories to ``OUT/robot<i>.csv`` (the layout of ``data=files``, no
``client`` column: the file name is the client) and its true parameters to
``OUT/robot<i>_truth.csv`` (columns repeat, client, parameter, value), the two files a
SuperNode gets as ``data-path`` and ``truth-path``.

    python examples/fleet_files.py OUT [--clients 3] [run.py overrides ...]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pandas as pd

import fnsysid


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="folder for robot<i>.csv and robot<i>_truth.csv")
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("overrides", nargs="*", default=["system=synthetic", "repeats=2",
                                                     "eps=0.2"])
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        fnsysid.run([*args.overrides, f"M={args.clients}", "R=1", "output.trajectories=true",
                     "output.plot=false"], Path(tmp) / "sim")
        traj = pd.read_parquet(Path(tmp) / "sim" / "trajectories.parquet")
        truth = pd.read_csv(Path(tmp) / "sim" / "truth.csv")
    for client, part in traj.groupby("client"):
        part.drop(columns="client").to_csv(out / f"robot{client}.csv", index=False,
                                           float_format="%.17g")
        own = truth[truth["client"] == client].assign(client=f"robot{client}")
        own.to_csv(out / f"robot{client}_truth.csv", index=False, float_format="%.17g")
    print(f"{args.clients} clients: {out}/robot<i>.csv and robot<i>_truth.csv")


if __name__ == "__main__":
    main()
