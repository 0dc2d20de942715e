"""Build the figures of scripts/figures.yaml: run their experiments, then draw them.

Usage: python scripts/make_figure.py NAME [NAME ...] | --all   [--plot-only] [--out figures]
       [--sweeps outputs/sweeps] [--override KEY=VALUE ...]

Each experiment (conf/experiment/<name>.yaml, a Hydra multirun) runs once per invocation into
outputs/sweeps/<name>/ (cleared first). Each figure is written as <out>/<NAME>.png and .pdf,
with <out>/<NAME>.csv holding the final error of every curve (mean and std over repeats).

Experiments run as ``python run.py experiment=<name>`` would, minus the process start-up:
Hydra's own multirun (its sweeper, the basic launcher running the jobs one after another, the
sweep callbacks) is invoked in a worker process that has already imported everything, and
``--jobs`` workers (default: the number of cores) take whole experiments, then whole figures,
from one queue. Workers are forked from this process, so nothing is imported twice.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import itertools
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

# one BLAS thread and one simulation thread per worker (the workers already share the cores)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("FNSYSID_THREADS", "1")

import pandas as pd  # noqa: E402

from fnsysid.data.source import reuse_simulations  # noqa: E402
from fnsysid.results.plotting.paper_panels import figure  # noqa: E402
from fnsysid.results.sweep import load_yaml  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = Path(__file__).with_name("figures.yaml")
SWEEPS = ROOT / "outputs" / "sweeps"
#: overrides of every experiment run here: quiet, no per-job plots (the figure is the product)
RUN_OVERRIDES = ["progress=false", "output.plot=false"]


def load_registry() -> dict:
    return load_yaml(REGISTRY)


def run_experiment(name: str, sweeps: Path, extra: list[str],
                   reuse: bool = True) -> tuple[float, str]:
    """Run one experiment's sweep from scratch into ``sweeps/name`` in this process.

    With ``reuse`` the jobs whose simulated data are the same share one simulation
    (:func:`fnsysid.data.source.reuse_simulations`). Returns (wall time, captured output);
    raises SystemExit naming the experiment if Hydra reports a failure.
    """
    import shutil

    from hydra.core.global_hydra import GlobalHydra

    from fnsysid.app.cli import task

    shutil.rmtree(sweeps / name, ignore_errors=True)
    t0 = time.perf_counter()
    argv = [str(ROOT / "run.py"), f"experiment={name}", "hydra/launcher=basic",
            f"hydra.sweep.dir={sweeps / name}", *RUN_OVERRIDES, *extra]
    out = io.StringIO()
    old_argv, code = sys.argv, 0
    try:
        sys.argv = argv
        GlobalHydra.instance().clear()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), \
                reuse_simulations() if reuse else contextlib.nullcontext():
            task()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = old_argv
        GlobalHydra.instance().clear()
    if code:
        raise SystemExit(f"make_figure: experiment {name} failed (exit {code}):\n"
                         f"{out.getvalue()[-4000:]}")
    return time.perf_counter() - t0, out.getvalue()


@contextlib.contextmanager
def _pool(jobs: int):
    """Workers forked from this process (imports shared); one task at a time each."""
    from hydra.core.plugins import Plugins

    import fnsysid.app.cli
    import fnsysid.app.experiment  # noqa: F401 - imported once here, shared by the workers

    Plugins.instance()                       # Hydra's plugin scan, also done once
    gc.freeze()           # the imported objects stay out of the workers' garbage collection
    # the workers build and drop OmegaConf nodes by the million: collect the youngest objects
    # every 20000 allocations instead of 700 (a third less time in the collector, ~20 %
    # more peak memory)
    threshold = gc.get_threshold()
    gc.set_threshold(20000, 20, 20)
    try:
        with ProcessPoolExecutor(max_workers=jobs,
                                 mp_context=multiprocessing.get_context("fork")) as pool:
            yield pool
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def expected_cost(name: str) -> float:
    """Rough relative cost of an experiment from its file: jobs x repeats x rounds."""
    from fnsysid.config.groups import CONF_DIR

    spec = load_yaml(CONF_DIR / "experiment" / f"{name}.yaml") or {}
    params = ((spec.get("hydra") or {}).get("sweeper") or {}).get("params") or {}
    jobs = 1
    for values in params.values():
        jobs *= len(str(values).split(","))
    return jobs * float(spec.get("repeats", 5)) * float(spec.get("R", 100))


def run_and_draw(names: list[str], registry: dict, args) -> dict[str, pd.DataFrame]:
    """Run the experiments of figures ``names`` (unless ``--plot-only``) and draw the figures,
    over ``args.jobs`` workers (in this process when 1).

    Experiments go first, the costliest first so that the workers finish together; each
    figure is queued as soon as its experiments have finished, so drawing overlaps the last
    experiments instead of waiting for all of them. Returns each figure's table."""
    needs = {n: {p["experiment"] for p in registry[n]["panels"]} for n in names}
    experiments = [] if args.plot_only else sorted(
        dict.fromkeys(e for n in names for e in sorted(needs[n])), key=expected_cost,
        reverse=True)
    run = (args.sweeps, args.override)
    if args.jobs <= 1:
        for e in experiments:
            print(f"ran experiment {e}: {run_experiment(e, *run)[0]:.1f} s", flush=True)
        return {n: draw(n, registry[n], args.out, args.sweeps) for n in names}
    with _pool(args.jobs) as pool:
        try:
            runs = {pool.submit(run_experiment, e, *run): e for e in experiments}
            done = set() if experiments else {e for n in names for e in needs[n]}
            draws = {}
            for f in itertools.chain([None], as_completed(runs)):
                if f is not None:
                    print(f"ran experiment {runs[f]}: {f.result()[0]:.1f} s", flush=True)
                    done.add(runs[f])
                for n in names:
                    if n not in draws and needs[n] <= done:
                        draws[n] = pool.submit(draw, n, registry[n], args.out, args.sweeps)
            return {n: draws[n].result() for n in names}
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def draw(name: str, spec: dict, out: Path, sweeps: Path) -> pd.DataFrame:
    panels = []
    for p in spec["panels"]:
        sweep = sweeps / p["experiment"]
        panels.append({**p, "dir": sweep, "where": p.get("where") or {}})
    table = figure(panels, out / name, ncols=spec.get("ncols"))      # caption: spec["paper"]
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
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="worker processes (default: the number of cores; 1: this process)")
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
    missing = [e for e in experiments if not any((args.sweeps / e).glob("**/errors.csv"))]
    if args.plot_only and missing:
        print(f"make_figure: error: no results for {', '.join(missing)}; run without "
              "--plot-only", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    # one store of simulated data per worker, shared by its experiments' jobs
    with reuse_simulations():
        tables = run_and_draw(names, registry, args)
    for n, table in tables.items():
        print(f"wrote {args.out / n}.png/.pdf/.csv ({len(table)} curves)")
        slopes = [c for c in table.columns if c.startswith("slope_vs_")]
        if slopes and table[slopes].notna().any().any():
            print(table[["panel", "series", *slopes]].drop_duplicates()
                  .to_string(index=False, float_format="%.3f"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
