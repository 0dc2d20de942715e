"""Benchmark: time and peak memory against M, K and p, beside a bare-numpy floor.

Usage: ``python scripts/bench.py [--cases paper,M,K,p,ragged,flower,oneshot,...] [--quick]
[--json FILE] [--plot FILE]`` (``make bench`` runs every case and writes
``outputs/bench/bench.json``; ``--plot`` draws the scaling figure of docs/PERFORMANCE.md from
such a file without running anything).

Every measurement is one fresh process, started here and timed from the outside: its wall
time, and its own peak RSS (``ru_maxrss``, printed by the process as it exits). A run is the
real command line, ``run.py`` with ``progress=false output.plot=false`` into a temporary folder;
its ``summary.json`` gives the split into data and rounds. The floor (``scripts/floor.py``)
does the same arithmetic as the pendulum run by hand; it runs in its own process right after
the run it is compared with, and the ratio is run compute (``runtime_s.total_s``) over floor
compute, and process over process.

Cases: **paper** the pendulum M-sweep of the paper (one process, six runs) and the synthetic
M=100 run; **M** the large pendulum run (N=10, T=5, K=5, R=200, repeats=1, lr 1e-2) for
M = 10^2 .. 10^6, with its floor; **K** the same at M=10^5 for K = 1, 5, 50 (round cost from
two runs, R=200 and R=20, so that precomputing the maps is apart; and the step-by-step path);
**p** the linear system with n_x = 2, 4, 8 (p = n_x (n_x + 2)) and the linear system with
quadratic features (p = 63), M = 1000; **ragged** trajectory files of 2000 clients of 2
samples and one of 10^5 beside the same rows spread evenly over the clients; **flower**
``runtime=flower`` with one trajectory file per client and a truth file, M = 100 and 1000,
time per round from the run's log (rounds 1 to 6), and whether it grows at most linearly in M.

Pairs, each an option's run beside the same run without it (back to back, wall and CPU time and
peak RSS, the goal a ratio of the two; ``--quick`` at a tenth of M): **oneshot**
``strategy=oneshot`` beside ``strategy=centralized_exact`` (synthetic, eps=0, R=1,
data.val_N=0, M=10^6): the clients' own least squares cost at most half the run again;
**personalize** ``personalize=auto`` beside ``none`` (synthetic, N=2, T=30, R=20, M=10^5,
``client_estimates.csv`` of 1.5 million rows); **modelcheck** ``output.model_check=true``
beside ``false`` (the same run, T >= 21 so that the check runs); **sparsity**
``sparsity=stlsq`` beside ``none`` (the same run).

**startup**: the small run ``run.py M=5 R=5 output.plot=false`` (goal: median <= 0.35 s)
beside the interpreter, ``import numpy`` and a Hydra application that does nothing on a config
of two settings, with and without numpy imported first: what any Hydra run pays before its
own work.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: the floor runs with the same BLAS setting as fnsysid (one thread)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
COMMON = ["progress=false", "output.plot=false"]
PEND = ["system=pendulum", "N=10", "T=5", "K=5", "R=200", "repeats=1", "lr=1e-2"]
M_VALUES = [100, 1000, 10_000, 100_000, 1_000_000]
K_VALUES = [1, 5, 50]
NX_VALUES = [2, 4, 8]
#: the goals of docs/PERFORMANCE.md (2-core machine)
GOAL_E2E_1E6_S, GOAL_E2E_1E5_S, GOAL_RSS_MIB, GOAL_RATIO = 10.0, 2.0, 1536.0, 1.5
#: the pair cases: (overrides of both runs, M, the option's overrides, the baseline's,
#: goal on the wall-time ratio, goal on the peak-RSS ratio or None)
SYN = ["system=synthetic", "N=2", "T=30", "R=20", "repeats=1"]
PAIRS = {
    "oneshot": (["system=synthetic", "eps=0", "R=1", "repeats=1", "data.val_N=0"], 1_000_000,
                ["strategy=oneshot"], ["strategy=centralized_exact"], 1.5, 1.5),
    "personalize": (SYN, 100_000, ["personalize=auto"], ["personalize=none"], 1.3, None),
    "modelcheck": (SYN, 100_000, ["output.model_check=true"], ["output.model_check=false"],
                   1.3, None),
    "sparsity": (SYN, 100_000, ["sparsity=stlsq"], ["sparsity=none"], 1.3, None),
}


def measure(cmd: list[str]) -> dict:
    """Run ``cmd`` to the end; its wall time, CPU time (user + system) and stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return dict(wall_s=wall, cpu_s=cpu, stdout=p.stdout)


def run_cmd(overrides: list[str], read=None) -> dict:
    """``run.py`` with ``overrides``; adds the summary's runtime split (and ``read(folder)``
    of the run's folder, when given, as ``read``)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-c", _WRAP, str(ROOT / "run.py"), *overrides, *COMMON,
               f"hydra.run.dir={tmp}"]
        res = measure(cmd)
        summary = json.loads((Path(tmp) / "summary.json").read_text())
        if read is not None:
            res["read"] = read(Path(tmp))
    res.update(summary["runtime_s"], status=summary["status"])
    res["rss_mib"] = _peak_from(res.pop("stdout"))
    return res


def floor_cmd(M: int, **kw) -> dict:
    args = ",".join(f"{k}={v}" for k, v in dict(M=M, **kw).items())
    res = measure([sys.executable, __file__, "--floor", args])
    out = json.loads(res["stdout"].strip().splitlines()[-1])
    return dict(wall_s=res["wall_s"], cpu_s=res["cpu_s"], rss_mib=out["peak_mib"],
                data_s=out["data_s"],
                train_s=out["train_s"], total_s=out["data_s"] + out["train_s"])


#: runs a script as __main__ and prints the process's peak RSS at exit (ru_maxrss, Linux KiB)
_WRAP = ("import atexit, resource, runpy, sys; atexit.register(lambda: print("
         "f'peak_mib={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f}', "
         "flush=True)); sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], "
         "run_name='__main__')")


def _peak_from(stdout: str) -> float:
    for line in reversed(stdout.splitlines()):
        if line.startswith("peak_mib="):
            return float(line.split("=", 1)[1])
    return float("nan")


def floor_main(spec: str) -> None:
    """Child process: run the floor once and print its timings as JSON."""
    import resource

    sys.path.insert(0, str(Path(__file__).parent))
    from floor import floor_pendulum

    kw = {k: int(v) if v.isdigit() else float(v) for k, v in
          (item.split("=") for item in spec.split(","))}
    _, t = floor_pendulum(**kw)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(dict(data_s=t["data_s"], train_s=t["train_s"], peak_mib=peak)))


def dense_system(n_x: int, n_u: int = 2) -> list[str]:
    """Overrides of a stable linear system with ``n_x`` states (p = n_x (n_x + n_u))."""
    def mat(rows):
        return "[" + ",".join("[" + ",".join(f"{v:g}" for v in r) + "]" for r in rows) + "]"
    A = [[0.5 if i == j else (0.1 if j == i + 1 else 0.0) for j in range(n_x)]
         for i in range(n_x)]
    B = [[1.0 if (i + j) % n_u == 0 else 0.5 for j in range(n_u)] for i in range(n_x)]
    V = [[1.0 if i == j else 0.0 for j in range(n_x)] for i in range(n_x)]
    U = [[1.0 if j == i % n_u else 0.0 for j in range(n_u)] for i in range(n_x)]
    return ["system=linear", f"system.A0={mat(A)}", f"system.B0={mat(B)}", f"system.V={mat(V)}",
            f"system.U={mat(U)}"]


def _row(cells, widths=(8, 7, 7, 7, 8, 8, 7, 7, 8, 9, 10, 9)) -> str:
    return "  ".join(str(c).rjust(w) for c, w in zip(cells, widths, strict=False)).rstrip()


def bench(cases: list[str], quick: bool) -> dict:
    import numpy as np

    results = dict(machine=dict(python=platform.python_version(), numpy=np.__version__,
                                cpus=os.cpu_count(), date=time.strftime("%Y-%m-%d %H:%M")),
                   cases={})
    print(f"python {platform.python_version()}, numpy {np.__version__}, {os.cpu_count()} cpus")
    print("wall_s: the whole process (interpreter, imports, config, run); cpu_s: its user + "
          "system time; comp: the run's runtime_s.total_s; rss: peak RSS of that process\n")
    if "paper" in cases:
        rows = []
        print("paper: pendulum M-sweep (6 runs, K=1, R=50, repeats=5) and synthetic M=100")
        for name, ovr in (("pendulum_M", ["experiment=pendulum_gd_M", "hydra/launcher=basic"]),
                          ("synthetic", ["system=synthetic", "M=100", "N=25", "T=5", "K=5",
                                         "R=200", "repeats=5"])):
            if name == "pendulum_M":
                with tempfile.TemporaryDirectory() as tmp:
                    res = measure([sys.executable, "-c", _WRAP, str(ROOT / "run.py"), *ovr,
                                   *COMMON, f"hydra.sweep.dir={tmp}"])
                    res["rss_mib"] = _peak_from(res.pop("stdout"))
                    total = sum(json.loads(p.read_text())["runtime_s"]["total_s"]
                                for p in Path(tmp).glob("*/summary.json"))
                res["total_s"] = total
            else:
                res = run_cmd(ovr)
            rows.append(dict(name=name, **res))
            print(f"  {name:11s} wall {res['wall_s']:6.2f} s  compute {res['total_s']:6.3f} s  "
                  f"rss {res['rss_mib']:7.1f} MiB")
        results["cases"]["paper"] = rows
    if "M" in cases:
        rows = []
        print("\nM: pendulum N=10 T=5 K=5 R=200 repeats=1 lr=1e-2, beside the floor")
        print(_row(["M", "wall_s", "cpu_s", "data_s", "train_s", "rss_MiB", "fl_wall", "fl_cpu",
                    "fl_comp", "ratio_cmp", "ratio_wall", "ratio_cpu"]))
        for M in ([100, 10_000] if quick else M_VALUES):
            ours = run_cmd(PEND + [f"M={M}"])
            fl = floor_cmd(M)
            row = dict(M=M, ours=ours, floor=fl, ratio_compute=ours["total_s"] / fl["total_s"],
                       ratio_wall=ours["wall_s"] / fl["wall_s"],
                       ratio_cpu=ours["cpu_s"] / fl["cpu_s"])
            rows.append(row)
            print(_row([M, f"{ours['wall_s']:.2f}", f"{ours['cpu_s']:.2f}", f"{ours['data_s']:.3f}",
                        f"{ours['train_s']:.3f}", f"{ours['rss_mib']:.0f}",
                        f"{fl['wall_s']:.2f}", f"{fl['cpu_s']:.2f}", f"{fl['total_s']:.3f}",
                        f"{row['ratio_compute']:.2f}", f"{row['ratio_wall']:.2f}",
                        f"{row['ratio_cpu']:.2f}"]))
        results["cases"]["M"] = rows
        for row in rows:
            goal = {1_000_000: GOAL_E2E_1E6_S, 100_000: GOAL_E2E_1E5_S}.get(row["M"])
            if goal:
                o = row["ours"]
                rss_ok = "yes" if o["rss_mib"] <= GOAL_RSS_MIB else "no"
                print(f"  goal M={row['M']}: wall {o['wall_s']:.2f} s <= {goal:g} s: "
                      f"{'yes' if o['wall_s'] <= goal else 'no'}; peak RSS {o['rss_mib']:.0f} "
                      f"MiB <= {GOAL_RSS_MIB:.0f}: {rss_ok}"
                      + (f"; ratio {row['ratio_compute']:.2f} <= {GOAL_RATIO}: "
                         f"{'yes' if row['ratio_compute'] <= GOAL_RATIO else 'no'}"
                         if row["M"] == 1_000_000 else ""))
    if "K" in cases:
        rows = []
        M = 10_000 if quick else 100_000
        print(f"\nK: the same run at M={M}; round = (train_s at R=200 - at R=20) / 180, setup = "
              "the rest (the maps); step path: optimizer.affine=false, train_s / 20 at R=20")
        base = [o for o in PEND if not o.startswith(("K=", "R="))] + [f"M={M}"]
        for K in K_VALUES:
            long = run_cmd(base + [f"K={K}", "R=200"])
            short = run_cmd(base + [f"K={K}", "R=20"])
            step = run_cmd(base + [f"K={K}", "R=20", "optimizer.affine=false"])
            round_ms = 1e3 * (long["train_s"] - short["train_s"]) / 180
            rows.append(dict(K=K, M=M, round_ms=round_ms,
                             setup_ms=1e3 * short["train_s"] - 20 * round_ms,
                             step_round_ms=1e3 * step["train_s"] / 20, train_s=long["train_s"],
                             rss_mib=long["rss_mib"]))
            print(f"  K={K:3d}  round {round_ms:6.2f} ms  setup {rows[-1]['setup_ms']:7.1f} ms  "
                  f"(step path: {rows[-1]['step_round_ms']:7.2f} ms a round)  "
                  f"rss {long['rss_mib']:.0f} MiB")
        results["cases"]["K"] = rows
    if "p" in cases:
        rows = []
        print("\np: M=1000, N=10, T=5, K=10, R=200, repeats=1, whitened mean gradient, lr 0.1")
        systems = [(f"linear n_x={n}", n * (n + 2), dense_system(n)) for n in NX_VALUES]
        systems.append(("linear poly2", 63, ["system=linear", "feature_map=polynomial"]))
        solver = ["optimizer.reduction=mean", "optimizer.scale_features=whiten", "lr=0.1"]
        for name, p, ovr in systems[:2] if quick else systems:
            res = run_cmd(ovr + solver + ["M=1000", "N=10", "T=5", "K=10", "R=200",
                                          "repeats=1"])
            rows.append(dict(name=name, p=p, **res))
            print(f"  {name:16s} p={p:3d}  data {res['data_s']:.3f} s  train {res['train_s']:.3f}"
                  f" s  wall {res['wall_s']:.2f} s  rss {res['rss_mib']:.0f} MiB")
        results["cases"]["p"] = rows
    if "ragged" in cases:
        rows = []
        n_small, n_big = (200, 10_000) if quick else (2000, 100_000)
        print(f"\nragged: trajectory files, {n_small} clients of 2 samples and one of {n_big} "
              "beside the same rows spread evenly (system=generic, R=50)")
        with tempfile.TemporaryDirectory() as tmp:
            rows_total = 2 * n_small + n_big
            even = rows_total // (n_small + 1)
            for name, lengths in (("ragged", [2] * n_small + [n_big]),
                                  ("even", [even] * (n_small + 1))):
                path = Path(tmp) / f"{name}.csv"
                fleet_csv(path, lengths)
                res = run_cmd(["system=generic", "data=files", f"data.path={path}",
                               "data.states=[x1,x2]", "data.inputs=[u]", "R=50"])
                rows.append(dict(name=name, rows=sum(lengths), clients=len(lengths), **res))
                print(f"  {name:7s} {sum(lengths):7d} rows  data {res['data_s']:.3f} s  train "
                      f"{res['train_s']:.3f} s  wall {res['wall_s']:.2f} s  rss "
                      f"{res['rss_mib']:.0f} MiB")
        results["cases"]["ragged"] = rows
    if "flower" in cases:
        results["cases"]["flower"] = bench_flower(quick)
    for name in (c for c in PAIRS if c in cases):
        results["cases"][name] = pair(name, quick)
    if "startup" in cases:
        results["cases"]["startup"] = bench_startup(quick)
    return results


#: the small run of the startup case and its goal (median wall time, s)
SMALL_RUN = ["M=5", "R=5", "output.plot=false"]
GOAL_SMALL_RUN_S = 0.35
#: a Hydra application that does nothing, on a config of two settings (``{config}`` its
#: folder); ``{imports}`` what it imports first
BARE_APP = """{imports}import hydra


@hydra.main(version_base="1.3", config_path={config!r}, config_name="config")
def app(cfg) -> None:
    pass


if __name__ == "__main__":
    app()
"""


def bench_startup(quick: bool) -> dict:
    """The small run (``run.py M=5 R=5 output.plot=false``) beside what any run of the same
    stack pays before its own work: the interpreter, importing numpy, and a Hydra application
    that does nothing on a config of two settings (``@hydra.main``, its job and ``.hydra/``
    files), alone and after importing numpy. Each command runs ``STARTUP_RUNS`` times (3 with
    ``quick``), interleaved; medians of the wall and CPU times."""
    import statistics

    runs = 3 if quick else STARTUP_RUNS
    print(f"\nstartup: medians of {runs} runs each, interleaved")
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "conf"
        conf.mkdir()
        (conf / "config.yaml").write_text("M: 5\nR: 5\n")
        for name, imports in (("bare.py", ""), ("bare_numpy.py", "import numpy\n")):
            (Path(tmp) / name).write_text(BARE_APP.format(imports=imports, config=str(conf)))
        commands = {
            "interpreter (python -c pass)": lambda i: [sys.executable, "-c", "pass"],
            "import numpy": lambda i: [sys.executable, "-c", "import numpy"],
            "Hydra app doing nothing, two settings": lambda i: [
                sys.executable, str(Path(tmp) / "bare.py"), f"hydra.run.dir={tmp}/bare{i}"],
            "the same after import numpy": lambda i: [
                sys.executable, str(Path(tmp) / "bare_numpy.py"), f"hydra.run.dir={tmp}/np{i}"],
            "run.py " + " ".join(SMALL_RUN): lambda i: [
                sys.executable, str(ROOT / "run.py"), *SMALL_RUN, f"hydra.run.dir={tmp}/run{i}"],
        }
        times = {k: [] for k in commands}
        for i in range(runs):
            for name, cmd in commands.items():
                times[name].append(measure(cmd(i)))
    rows = {}
    for name, res in times.items():
        wall = statistics.median(r["wall_s"] for r in res)
        cpu = statistics.median(r["cpu_s"] for r in res)
        rows[name] = dict(wall_s=wall, cpu_s=cpu)
        print(f"  {name:44s} wall {wall:6.3f} s  cpu {cpu:6.3f} s")
    small = rows["run.py " + " ".join(SMALL_RUN)]["wall_s"]
    print(f"  goal: small run {small:.3f} s <= {GOAL_SMALL_RUN_S} s: "
          f"{'yes' if small <= GOAL_SMALL_RUN_S else 'no'}")
    return rows


#: the Flower case: clients, and rounds (a round's time from the log's times of rounds 1 and R)
FLOWER_M = [100, 1000]
FLOWER_R = 6
#: the synthetic fleet of the Flower case (one CSV per client, and a truth file)
FLOWER_DATA = ["system=synthetic", "N=2", "T=20", "repeats=1", "eps=0.3"]


def round_times(folder: Path) -> list[float]:
    """The times (s) at which the run's log says each round was done."""
    import datetime as dt

    out = []
    for line in (folder / "run.log").read_text().splitlines():
        if "] round " in line and " done: " in line:
            stamp = line[1:line.index("]")]
            out.append(dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return out


def client_files(folder: Path, M: int) -> tuple[Path, Path]:
    """A folder of ``M`` client CSVs (one per client, no ``client`` column) and a truth file,
    from a simulated run's trajectories (as tests/test_flower.py makes them)."""
    import pandas as pd

    from fnsysid.data.files import write_client_files

    sim = folder / "sim"
    measure([sys.executable, str(ROOT / "run.py"), *FLOWER_DATA, f"M={M}", "R=1",
             "output.trajectories=true", *COMMON, f"hydra.run.dir={sim}"])
    clients = folder / "clients"
    write_client_files(pd.read_parquet(sim / "trajectories.parquet"), clients, "c{client:05d}")
    truth = pd.read_csv(sim / "truth.csv")
    truth["client"] = "c" + truth["client"].astype(int).map("{:05d}".format)
    truth.to_csv(folder / "truth.csv", index=False, float_format="%.17g")
    return clients, folder / "truth.csv"


def bench_flower(quick: bool) -> dict:
    """runtime=flower (Flower's simulation engine, one ClientApp per client, each reading its
    own file) for M = 100 and 1000: a round's time from the run's log, (time of round R's line
    - time of round 1's line) / (R - 1), so that the start (Ray, the ClientApps reading their
    files, the first query) and round 1 are apart."""
    # Ray kills a worker when the machine's memory is 95 % used, whoever uses it (a shared
    # machine): its memory monitor off for these runs (docs.ray.io, "Out-Of-Memory Prevention")
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    Ms = [m // 10 for m in FLOWER_M] if quick else FLOWER_M
    R = FLOWER_R
    print(f"\nflower: runtime=flower, data=files with a truth file, synthetic fleet "
          f"({' '.join(FLOWER_DATA[1:])}), fedavg, output.model_check=false, R={R}; round = "
          f"(log time of round {R} - of round 1) / {R - 1}")
    rows = []
    for M in Ms:
        with tempfile.TemporaryDirectory() as tmp:
            clients, truth = client_files(Path(tmp), M)
            res = run_cmd(["runtime=flower", "system=synthetic", "data=files",
                           f"data.path={clients}", f"data.truth={truth}",
                           "output.model_check=false", f"R={R}"], read=round_times)
        times = res.pop("read")
        if len(times) != R:
            sys.exit(f"bench: the log of M={M} has {len(times)} round lines, not {R}")
        round_s = (times[-1] - times[0]) / (R - 1)
        rows.append(dict(M=M, round_s=round_s, train_s=res["train_s"], wall_s=res["wall_s"],
                         cpu_s=res["cpu_s"], rss_mib=res["rss_mib"]))
        print(f"  M={M:5d}  round {round_s:7.3f} s  ({1e3 * round_s / M:.2f} ms a client)  "
              f"train_s {res['train_s']:.1f} s  wall {res['wall_s']:.1f} s  rss "
              f"{res['rss_mib']:.0f} MiB (server process)")
    growth = rows[1]["round_s"] / rows[0]["round_s"]
    linear = rows[1]["M"] / rows[0]["M"]
    print(f"  goal: time per round grows at most linearly from M={rows[0]['M']} to "
          f"{rows[1]['M']} (ratio <= {linear:g}): ratio {growth:.2f}, "
          f"{'yes' if growth <= linear else 'no'}")
    return dict(rows=rows, ratio=growth, linear=linear, goal_met=bool(growth <= linear))


def pair(name: str, quick: bool) -> dict:
    """One pair case of :data:`PAIRS`: the option's run and the baseline's, back to back,
    with the ratios and whether they meet the goals."""
    common, M, option, base, goal_wall, goal_rss = PAIRS[name]
    M = M // 10 if quick else M
    print(f"\n{name}: {' '.join(common)} M={M}: {' '.join(option)} beside {' '.join(base)}")
    runs = {}
    for label, ovr in (("option", option), ("baseline", base)):
        res = run_cmd(common + [f"M={M}"] + ovr)
        runs[label] = res
        print(f"  {' '.join(ovr):28s} wall {res['wall_s']:7.2f} s  cpu {res['cpu_s']:7.2f} s  "
              f"data {res['data_s']:6.2f} s  train {res['train_s']:6.2f} s  "
              f"rss {res['rss_mib']:6.0f} MiB")
    ratio = {k: runs["option"][k] / runs["baseline"][k] for k in ("wall_s", "cpu_s", "rss_mib")}
    line = (f"  goal: wall {ratio['wall_s']:.2f} x <= {goal_wall}: "
            f"{'yes' if ratio['wall_s'] <= goal_wall else 'no'} (cpu {ratio['cpu_s']:.2f} x)")
    if goal_rss is not None:
        line += (f"; peak RSS {ratio['rss_mib']:.2f} x <= {goal_rss}: "
                 f"{'yes' if ratio['rss_mib'] <= goal_rss else 'no'}")
    print(line)
    return dict(M=M, runs=runs, ratio=ratio, goal_wall=goal_wall, goal_rss=goal_rss)


def fleet_csv(path: Path, lengths: list[int]) -> None:
    """One CSV of clients with ``lengths`` samples of x+ = A x + B u + noise (one trajectory
    each), simulated for the clients of one length at once."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    lengths = np.asarray(lengths)
    A, B = np.array([[0.9, 0.2], [-0.1, 0.8]]), np.array([0.0, 0.5])
    parts = []
    for L in np.unique(lengths):
        ids = np.flatnonzero(lengths == L)
        u = rng.standard_normal((L, len(ids)))
        x = np.empty((L, len(ids), 2))
        x[0] = rng.standard_normal((len(ids), 2))
        for t in range(L - 1):
            x[t + 1] = x[t] @ A.T + u[t, :, None] * B + 0.05 * rng.standard_normal((len(ids), 2))
        parts.append(pd.DataFrame({"client": np.repeat(ids, L), "t": np.tile(np.arange(L),
                                                                             len(ids)),
                                   "x1": x[..., 0].T.ravel(), "x2": x[..., 1].T.ravel(),
                                   "u": u.T.ravel()}))
    pd.concat(parts).to_csv(path, index=False)


def plot(results: dict, path: Path) -> None:
    """Scaling figure: time and memory against M (log-log), round time against K, time
    against p."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(15, 3.6), constrained_layout=True)
    c = results["cases"]
    if "M" in c:
        Ms = [r["M"] for r in c["M"]]
        ax = axes[0]
        ax.loglog(Ms, [r["ours"]["wall_s"] for r in c["M"]], "o-", label="run.py, process")
        ax.loglog(Ms, [r["ours"]["total_s"] for r in c["M"]], "s-", label="run compute")
        ax.loglog(Ms, [r["floor"]["total_s"] for r in c["M"]], "^--", label="bare-numpy floor")
        ax.set(xlabel="clients M", ylabel="seconds", title="time against M")
        ax.legend(fontsize=8)
        ax = axes[1]
        ax.loglog(Ms, [r["ours"]["rss_mib"] for r in c["M"]], "o-", label="run.py")
        ax.loglog(Ms, [r["floor"]["rss_mib"] for r in c["M"]], "^--", label="floor")
        ax.set(xlabel="clients M", ylabel="peak RSS (MiB)", title="memory against M")
        ax.legend(fontsize=8)
    if "K" in c:
        ax = axes[2]
        Ks = [r["K"] for r in c["K"]]
        ax.loglog(Ks, [r["round_ms"] for r in c["K"]], "o-", label="affine maps (default)")
        ax.loglog(Ks, [r["step_round_ms"] for r in c["K"]], "^--", label="step by step")
        ax.set(xlabel="local steps K", ylabel="ms per round",
               title=f"round cost against K (M={c['K'][0]['M']})")
        ax.legend(fontsize=8)
    if "p" in c:
        ax = axes[3]
        ps = [r["p"] for r in c["p"]]
        ax.loglog(ps, [r["data_s"] for r in c["p"]], "o", label="data")
        ax.loglog(ps, [r["train_s"] for r in c["p"]], "s", label="rounds")
        ax.set(xlabel="parameters p", ylabel="seconds", title="time against p (M=1000)")
        ax.set_xticks(sorted(ps), [str(p) for p in sorted(ps)])
        ax.minorticks_off()
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


#: runs of each command of the startup case
STARTUP_RUNS = 7
#: the benchmark cases, in the order they run
CASES = ("paper", "M", "K", "p", "ragged", "flower", *PAIRS, "startup")


def _cases(text: str) -> list[str]:
    """``--cases``: names of :data:`CASES`, comma-separated (an unknown one is refused)."""
    names = text.split(",")
    bad = [n for n in names if n not in CASES]
    if bad:
        raise argparse.ArgumentTypeError(f"{','.join(bad)} is not a case; allowed: "
                                         f"{','.join(CASES)}")
    return names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES), type=_cases,
                    help=f"comma-separated: {','.join(CASES)}")
    ap.add_argument("--quick", action="store_true", help="small sizes only")
    ap.add_argument("--json", type=Path, default=ROOT / "outputs" / "bench" / "bench.json")
    ap.add_argument("--plot", type=Path, help="draw the scaling figure from --json and stop")
    ap.add_argument("--floor", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.floor:
        return floor_main(args.floor)
    if args.plot:
        return plot(json.loads(args.json.read_text()), args.plot)
    results = bench(args.cases, args.quick)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nwrote {args.json}")
    return None


if __name__ == "__main__":
    main()
