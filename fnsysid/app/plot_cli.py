"""``fnsysid-plot``: draw a multirun folder (one curve per swept value, or a grid, or a heat map).

Usage: fnsysid-plot SWEEP_DIR [--out fig.png] [--metric e_max|e_mean|nrmse_*] [--title TEXT]
       [--panels KEY] [--heatmap]

One swept key: one panel with one curve per value. Two or more: one panel per value of the
first swept key (or ``--panels KEY``), one curve per value of the others, one legend for the
figure. ``--heatmap`` draws the final error of a two-key sweep as a heat map instead. Labels show
only the keys the sweep varies. Writes the figure (PNG and PDF) and a CSV of the final error of
every curve; by default ``sweep.png`` in the sweep's folder for the default view, and a name
that says the view for the others (``sweep_heatmap.png``, ``sweep_panels-eps.png``,
``sweep_e_mean.png``), so one view never overwrites another. SWEEP_DIR may also be a stored
experiment's folder (``outputs/sweeps/<name>``): its newest sweep is drawn.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from fnsysid.config.errors import some
from fnsysid.results.plotting.style import METRICS
from fnsysid.results.plotting.sweep_plots import status_text, sweep_figure, sweep_heatmap
from fnsysid.results.sweep import declared_keys, find_sweep, read_sweep, swept_keys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="fnsysid-plot", description=__doc__.splitlines()[0])
    ap.add_argument("sweep_dir", type=Path, help="a Hydra multirun folder")
    ap.add_argument("--out", type=str, default=None,
                    help="figure path (default: <sweep>/sweep.png, or a name for the view: "
                         "sweep_heatmap.png, sweep_panels-KEY.png, sweep_e_mean.png); a .pdf "
                         "and a .csv are written too")
    ap.add_argument("--metric", choices=sorted(METRICS), default=None,
                    help="e_max: max over clients (the paper's e_r; the default where the "
                         "sweep has ground truth, else nrmse_1step_mean); e_mean: mean over "
                         "clients; nrmse_*: held-out one-step or free-run NRMSE, max or "
                         "mean over clients")
    ap.add_argument("--title", default=None)
    ap.add_argument("--panels", default=None, metavar="KEY",
                    help="swept key drawn as one panel per value (default: the first)")
    ap.add_argument("--heatmap", action="store_true",
                    help="final error of a two-key sweep as a heat map")
    args = ap.parse_args(argv)
    if not args.sweep_dir.is_dir():
        return _error(f"{args.sweep_dir} is not a folder")
    problem = out_problem(args.out)
    if problem:
        return _error(problem)
    sweep = find_sweep(args.sweep_dir)
    jobs = read_sweep(sweep)
    if not jobs:
        return _error(f"no finished jobs (errors.csv) under {sweep}")
    if not any(j["summary"].get("status") == "ok" for j in jobs):
        bad = [f"{j['dir'].relative_to(sweep).as_posix()} ({status_text(j['summary'])})"
               for j in jobs]
        print(f"fnsysid-plot: error: nothing to draw under {sweep}: no job ended ok: "
              + ", ".join(some(bad, 5)), file=sys.stderr)
        return 3
    ok = [j for j in jobs if j["summary"].get("status") == "ok"]
    have = [m for m in sorted(METRICS) if any(
        m in j["errors"] and j["errors"][m].notna().any() for j in ok)]
    metric = args.metric or ("e_max" if "e_max" in have or not have else "nrmse_1step_mean")
    if metric not in have:
        return _error(f"--metric {metric}: no values in the sweep's errors.csv"
                      + (" (e_* need ground truth: data.truth or simulated data)"
                         if metric.startswith("e_") else "")
                      + f"; allowed: {', '.join(have) or 'none (no metric has values)'}")
    if args.metric is None and metric != "e_max":
        print(f"fnsysid-plot: no e_max (no ground truth): drawing {metric} (--metric chooses)")
    keys = swept_keys(jobs, declared_keys(sweep))
    out = Path(args.out) if args.out is not None else sweep / default_name(
        args.metric or "e_max", args.panels, args.heatmap)
    outs = [out.with_suffix(".png"), out.with_suffix(".pdf")]
    existed = {p for p in [*outs, out.with_suffix(".csv")] if p.exists()}
    try:
        if args.heatmap:
            table = sweep_heatmap(jobs, keys, outs, metric, args.title)
        else:
            table = sweep_figure(jobs, keys, outs, metric, args.title, args.panels)
        table.to_csv(out.with_suffix(".csv"), index=False)
    except ValueError as exc:
        return _error(str(exc))
    except OSError as exc:          # nothing half-written: the files this call made go
        for p in [*outs, out.with_suffix(".csv")]:
            if p not in existed and p.is_file():
                p.unlink(missing_ok=True)
        return _error(f"--out {out}: cannot be written ({exc.strerror or exc}); allowed: a "
                      "path in a folder this user can write")
    print(table.to_string(index=False))
    print(f"wrote {outs[0]}, .pdf and .csv")
    return 0


def default_name(metric: str, panels: str | None, heatmap: bool) -> str:
    """The figure's file name when ``--out`` is not given: ``sweep.png`` for the default
    view (``e_max``, the first key's panels, no heat map), else ``sweep_`` and the view's
    parts (``sweep_e_mean_heatmap.png``, ``sweep_panels-eps.png``)."""
    parts = [metric] if metric != "e_max" else []
    if heatmap:
        parts.append("heatmap")
    elif panels is not None:
        parts.append("panels-" + panels.replace(os.sep, "_"))
    return "_".join(["sweep", *parts]) + ".png"


#: the longest name of a file (bytes) on the file systems fnsysid writes to
NAME_MAX = 255


def out_problem(out: str | None) -> str | None:
    """Why ``--out`` cannot name the figure (its .png, .pdf and .csv), or None."""
    if out is None:
        return None
    allowed = "allowed: a file path such as fig.png in an existing folder"
    if not out.strip():
        return f"--out is empty; {allowed}"
    path = Path(out)
    if path.name in ("", ".", ".."):
        return f"--out {out} names a folder, not a file; {allowed}"
    longest = max(len(os.fsencode(p.name)) for p in
                  (path.with_suffix(s) for s in (".png", ".pdf", ".csv")))
    if longest > NAME_MAX or any(len(os.fsencode(part)) > NAME_MAX for part in path.parts):
        return f"--out {out}: a name longer than {NAME_MAX} bytes; {allowed}"
    parent = path.parent
    if not parent.is_dir():
        return f"--out {out}: the folder {parent} does not exist; {allowed}"
    return None


def _error(message: str) -> int:
    print(f"fnsysid-plot: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
