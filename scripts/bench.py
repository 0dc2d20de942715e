"""Benchmark: time and peak memory of fixed experiment cases (see docs/PERFORMANCE.md).

Usage: ``python scripts/bench.py [--cases a,b,c] [--quick]`` (``make bench`` runs all cases).

Every case (and every M of case c) runs in its own fresh subprocess (``--one``), which composes
the config with Hydra's compose API, calls ``run_experiment`` into a temporary folder and prints
one JSON line: per run the ``data_s``/``train_s`` of the summary and the wall time of the call,
and the process's peak RSS (``ru_maxrss``). A bare interpreter that only imports fnsysid and
hydra gives the baseline RSS. Goals are printed beside the numbers; the exit status is 0.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time

PEND = ["system=pendulum", "N=10", "T=5"]
#: case -> (overrides, M values, one subprocess per M)
CASES = {
    "a": (PEND + ["K=1", "R=50", "repeats=5"], [1, 9, 25, 49, 64, 81], False),
    "b": (["system=synthetic", "N=25", "T=5", "K=5", "R=200", "repeats=5"], [100], False),
    "c": (PEND + ["K=5", "R=200", "repeats=1"], [1000, 10000, 100000], True),
}
QUICK_M = {"c": [1000]}
COMMON = ["progress=false", "output.plot=false"]
REFERENCE_S = {"a": 24.0, "b": 1.2}   # published notebooks
COMPUTE_GOAL_S, E2E_GOAL_S, RSS_GOAL_MIB = 1.0, 10.0, 2048.0


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # KiB on Linux


def worker(case: str, ms: list[int]) -> None:
    """Run ``case`` for each M in this process; print one JSON line."""
    import hydra
    from hydra.core.global_hydra import GlobalHydra

    from fnsysid.experiment import run_experiment
    from fnsysid.options import CONF_DIR

    overrides, _, _ = CASES[case]
    runs = []
    GlobalHydra.instance().clear()
    with hydra.initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for m in ms:
            cfg = hydra.compose("config", overrides=overrides + COMMON + [f"M={m}"])
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                summary = run_experiment(cfg, tmp)
                wall = time.perf_counter() - t0
            rt = summary["runtime_s"]
            runs.append(dict(M=m, data_s=rt["data_s"], train_s=rt["train_s"], wall_s=wall,
                             status=summary["status"], rss_mib=_peak_mib()))
    print(json.dumps(dict(runs=runs, peak_mib=_peak_mib())))


def baseline() -> None:
    import hydra  # noqa: F401

    import fnsysid.experiment  # noqa: F401

    print(json.dumps(dict(peak_mib=_peak_mib())))


def _spawn(args: list[str]) -> tuple[dict, float]:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"bench: {' '.join(args)} failed ({p.returncode}):\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1]), wall


def _row(*cells) -> str:
    widths = (5, 7, 8, 8, 8, 7, 13, 22, 4)
    return "  ".join(str(c).rjust(w) if i < 7 else str(c).ljust(w)
                     for i, (c, w) in enumerate(zip(cells, widths, strict=False))).rstrip()


def _yes(ok: bool) -> str:
    return "yes" if ok else "no"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="a,b,c", help="comma-separated subset of a,b,c")
    ap.add_argument("--quick", action="store_true", help="only the small sizes of case c")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--M", help=argparse.SUPPRESS)
    ap.add_argument("--baseline", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.baseline:
        return baseline()
    if args.one:
        return worker(args.one, [int(m) for m in args.M.split(",")])

    import numpy as np

    print(f"python {platform.python_version()}, numpy {np.__version__}")
    base, _ = _spawn(["--baseline"])
    print(f"baseline RSS (python + import fnsysid.experiment, hydra): {base['peak_mib']:.1f} MiB")
    print("wall_s: run_experiment call; proc_s: whole subprocess (interpreter start, imports, "
          "all its runs); peak_rss_MiB: ru_maxrss of the subprocess so far\n")
    print(_row("case", "M", "data_s", "train_s", "wall_s", "proc_s", "peak_rss_MiB", "goal",
               "met"))
    for case in args.cases.split(","):
        _, ms, split = CASES[case]
        ms = QUICK_M.get(case, ms) if args.quick else ms
        jobs = [[m] for m in ms] if split else [ms]
        tot = dict(data_s=0.0, train_s=0.0, wall_s=0.0, proc=0.0, rss=0.0)
        for job in jobs:
            res, proc = _spawn(["--one", case, "--M", ",".join(map(str, job))])
            tot["proc"] += proc
            tot["rss"] = max(tot["rss"], res["peak_mib"])
            for r in res["runs"]:
                for k in ("data_s", "train_s", "wall_s"):
                    tot[k] += r[k]
                goal, met = "", ""
                if case == "c" and r["M"] == 100000:
                    goal = f"proc<{E2E_GOAL_S:g}s,rss<2GiB"
                    met = _yes(proc < E2E_GOAL_S and res["peak_mib"] < RSS_GOAL_MIB)
                note = "" if r["status"] == "ok" else f" [{r['status']}]"
                print(_row(case, r["M"], f"{r['data_s']:.4f}", f"{r['train_s']:.4f}",
                           f"{r['wall_s']:.3f}", f"{proc:.2f}" if len(job) == 1 else "",
                           f"{r['rss_mib']:.1f}", goal, met) + note)
        if case in REFERENCE_S:
            compute = tot["data_s"] + tot["train_s"]
            print(_row(case, "total", f"{tot['data_s']:.4f}", f"{tot['train_s']:.4f}",
                       f"{tot['wall_s']:.3f}", f"{tot['proc']:.2f}", f"{tot['rss']:.1f}",
                       f"compute<{COMPUTE_GOAL_S:g}s", _yes(compute < COMPUTE_GOAL_S))
                  + f"  (compute={compute:.4f}s; notebook ref {REFERENCE_S[case]:g}s)")
    return None


if __name__ == "__main__":
    main()
