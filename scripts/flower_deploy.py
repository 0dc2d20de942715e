"""Run one experiment on a local Flower deployment and compare it with the in-process run.

On 127.0.0.1 only: one SuperLink, one SuperNode per client (each with the path of its own
trajectory file in its node config), and ``flwr run deploy/flower`` submitting the run. The
same files are then run in process; the per-round errors must agree to 1e-10.

    python scripts/flower_deploy.py [--out DIR] [--clients 3] [run.py overrides ...]
    make flower-deploy ARGS="strategy=scaffold R=10"

Steps: (1) simulate M clients and write each client's trajectories to ``DIR/data/<i>.parquet``
and its true parameters to ``DIR/truth/<i>.csv`` (all clients': ``DIR/truth.csv``); (2) the
in-process run on those files into ``DIR/inprocess``; (3) the deployment
(``FLWR_HOME=DIR/flwr-home``) writing ``DIR/flower``;
(4) the comparison. Needs the ``flower`` extra. Every process it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
HOST = "127.0.0.1"
#: the lines of the ServerApp's log shown while a deployment runs (one per round, results)
PROGRESS = re.compile(r"(round \d+ of \d+ done.*|results: .*)$")
#: the experiment when no overrides are given: small and quick
DEFAULT = ["system=synthetic", "R=5", "repeats=2", "eps=0.2", "strategy=fedavg"]


def free_ports(n: int) -> list[int]:
    """``n`` free TCP ports on the loopback address."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind((HOST, 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def make_data(out: Path, M: int, overrides: list[str]) -> list[str]:
    """Simulate M clients; one trajectory file per client and the truth. Returns overrides
    that read them (the same for both runtimes)."""
    import fnsysid
    from fnsysid.config.checks import FILE_KNOBS, override_key

    sim = out / "simulated"
    fnsysid.run([*overrides, f"M={M}", "output.trajectories=true", "output.plot=false"], sim)
    traj = pd.read_parquet(sim / "trajectories.parquet")
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    truth = pd.read_csv(sim / "truth.csv")
    (out / "truth").mkdir(exist_ok=True)
    for client, part in traj.groupby("client"):
        part.to_parquet(data / f"{client}.parquet", index=False)
        truth[truth["client"] == client].to_csv(out / "truth" / f"{client}.csv", index=False,
                                                float_format="%.17g")
    truth.to_csv(out / "truth.csv", index=False, float_format="%.17g")
    # N, T, eps and the data.* settings of the simulation shaped the files; a run reading them
    # refuses them (it gets data.* of its own below)
    reading = [o for o in overrides if override_key(o) not in FILE_KNOBS
               and not override_key(o).startswith("data.")]
    return [*reading, f"M={M}", "data=files", f"data.path={data}",
            f"data.truth={out / 'truth.csv'}", "data.holdout=0"]


class Federation:
    """A SuperLink and SuperNodes on the loopback address, stopped on exit."""

    def __init__(self, home: Path, data_files: list[Path], truth: Path, log_dir: Path,
                 certs: Path | None = None):
        self.home, self.truth, self.log_dir = home, truth, log_dir
        #: with TLS and node authentication: the folder of scripts/flower_certs.py's files
        self.certs = certs
        self.procs: list[subprocess.Popen] = []
        self.names: list[str] = []
        self.link_port, *self.node_ports = free_ports(1 + len(data_files))
        self.env = {**os.environ, "FLWR_HOME": str(home),
                    "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(
            '[superlink]\ndefault = "fnsysid-local"\n\n'
            f'[superlink.fnsysid-local]\naddress = "{HOST}:{self.link_port}"\n'
            + ("insecure = true\n" if certs is None else
               f'root-certificates = "{certs / "ca.crt"}"\n'))
        self.data_files = data_files

    def _start(self, name: str, args: list[str]) -> None:
        log = open(self.log_dir / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        self.procs.append(subprocess.Popen(args, env=self.env, stdout=log,
                                           stderr=subprocess.STDOUT, cwd=self.log_dir))
        self.names.append(name)

    def stopped(self) -> list[str]:
        """The processes that ended on their own: ``name (file, exit code)``."""
        out = []
        for i, (name, proc) in enumerate(zip(self.names, self.procs, strict=True)):
            if proc.poll() is not None:
                what = f", {self.data_files[i - 1].name}" if i else ""
                out.append(f"{name} ({self.log_dir / name}.log{what}, exit {proc.returncode})")
        return out

    def __enter__(self):
        c = self.certs
        tls = ["--insecure"] if c is None else [
            "--ssl-ca-certfile", str(c / "ca.crt"), "--ssl-certfile", str(c / "server.pem"),
            "--ssl-keyfile", str(c / "server.key"), "--enable-supernode-auth"]
        self._start("superlink", [str(BIN / "flower-superlink"), *tls, "--host", HOST,
                                  "--port", str(self.link_port),
                                  "--disable-runtime-dependency-installation"])
        wait_for_port(self.link_port, self.procs[0])
        for i, (path, port) in enumerate(zip(self.data_files, self.node_ports, strict=True)):
            if c is not None:           # only registered SuperNodes may connect
                subprocess.run([str(BIN / "flwr"), "supernode", "register",
                                str(c / f"node{i}.pub"), "fnsysid-local"], env=self.env,
                               check=True, capture_output=True, cwd=self.log_dir, timeout=120)
            self._start(f"supernode{i}", [
                str(BIN / "flower-supernode"),
                *(["--insecure"] if c is None else [
                    "--root-certificates", str(c / "ca.crt"),
                    "--auth-supernode-private-key", str(c / f"node{i}")]),
                "--superlink", f"{HOST}:{self.link_port}", "--host", HOST, "--port", str(port),
                "--node-config", f"data-path='{path}' "
                                 f"truth-path='{self.truth / path.stem}.csv'"])
        return self

    def run(self, overrides: list[str], outdir: Path, timeout: float, log: Path,
            show=print) -> int:
        """``flwr run deploy/flower`` with the experiment's overrides; waits for the end and
        returns its exit status. Everything it prints goes to ``log``; the ServerApp's
        progress lines (:data:`PROGRESS`: one per round, the results) are also passed to
        ``show`` as they arrive."""
        run_config = f"overrides='{' '.join(overrides)}' outdir='{outdir}'"
        proc = subprocess.Popen([str(BIN / "flwr"), "run", str(ROOT / "deploy" / "flower"),
                                 "fnsysid-local", "--stream", "--run-config", run_config],
                                env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, cwd=self.log_dir)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        self.round_times = []
        try:
            with open(log, "w") as out:
                for line in proc.stdout:
                    out.write(line)
                    out.flush()
                    if PROGRESS.search(line):
                        show(f"  {PROGRESS.search(line).group(0).strip()}", flush=True)
                        if "done" in line:
                            self.round_times.append(time.perf_counter())
            return proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def __exit__(self, *exc):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        # the SuperLink and SuperNodes start helper processes in sessions of their own, which
        # name their parent's pid or our ports on their command lines
        marks = [f"{HOST}:{p}" for p in (self.link_port, *self.node_ports)]
        marks += [f"--parent-pid {p.pid}" for p in self.procs]
        for proc in leftover(marks):
            try:
                proc.terminate()
            except psutil.NoSuchProcess:
                pass


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Wait until ``proc`` listens on ``port`` (loopback)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"the SuperLink stopped (exit {proc.returncode}); see its log")
        with socket.socket() as s:
            if s.connect_ex((HOST, port)) == 0:
                return
        time.sleep(0.5)
    raise SystemExit(f"nothing listens on {HOST}:{port} after {timeout:g} s")


def leftover(marks: list[str]) -> list[psutil.Process]:
    """Flower processes whose command line contains one of ``marks``."""
    out = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or ())
        if ("flower-" in cmd or "flwr-" in cmd) and any(m in cmd for m in marks):
            out.append(proc)
    return out


#: the columns of errors.csv compared: parameter errors and the held-out NRMSE (federated
#: evaluation)
COMPARED = ("e_max", "e_mean", "nrmse_1step_max", "nrmse_1step_mean", "nrmse_sim_max",
            "nrmse_sim_mean")


def compare(a: Path, b: Path) -> float:
    """Largest difference of the per-round errors and held-out NRMSE of two runs (inf where
    one run has a value the other lacks)."""
    ea, eb = pd.read_csv(a / "errors.csv"), pd.read_csv(b / "errors.csv")
    if len(ea) != len(eb):
        raise SystemExit(f"the runs have {len(ea)} and {len(eb)} rows in errors.csv")
    diff = 0.0
    for c in COMPARED:
        x, y = ea[c].to_numpy(float), eb[c].to_numpy(float)
        if (np.isnan(x) != np.isnan(y)).any():
            return float("inf")
        both = ~np.isnan(x)
        if both.any():
            diff = max(diff, float(np.abs(x[both] - y[both]).max()))
    return diff


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="outputs/flower-deploy", help="results folder")
    ap.add_argument("--clients", type=int, default=3, help="SuperNodes (one client each)")
    ap.add_argument("--timeout", type=float, default=1200, help="seconds for the flwr run")
    ap.add_argument("--tls", action="store_true",
                    help="TLS and node authentication: certificates and SuperNode keys made "
                         "by scripts/flower_certs.py into DIR/certs, each SuperNode "
                         "registered with flwr supernode register")
    ap.add_argument("overrides", nargs="*", help="run.py overrides (default: a small run)")
    args = ap.parse_args(argv)
    from fnsysid.runtimes.check import INSTALL_FLOWER, flower_installed

    if not flower_installed():
        raise SystemExit(f"flower_deploy: Flower is not installed: {INSTALL_FLOWER}")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    from fnsysid.config.checks import override_key

    given = args.overrides or DEFAULT
    # runtime=flower runtime.reply_timeout=...: for the deployment only (the simulation and
    # the in-process run are in process)
    on_flower = [o for o in given if override_key(o).split(".")[0] == "runtime"]
    overrides = make_data(out, args.clients, [o for o in given if o not in on_flower])

    import fnsysid

    t0 = time.perf_counter()
    fnsysid.run([*overrides, "output.plot=false"], out / "inprocess")
    t_inprocess = time.perf_counter() - t0

    files = sorted((out / "data").glob("*.parquet"))
    t0 = time.perf_counter()
    print(f"deployment on {HOST}: a SuperLink and {len(files)} SuperNodes, then flwr run "
          f"(log: {out / 'flwr-run.log'})", flush=True)
    certs = None
    if args.tls:
        import importlib.util

        spec = importlib.util.spec_from_file_location("flower_certs",
                                                      ROOT / "scripts" / "flower_certs.py")
        flower_certs = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(flower_certs)
        certs = out / "certs"
        flower_certs.make(certs, [HOST], len(files))
    with Federation(out / "flwr-home", files, out / "truth", out, certs) as fed:
        code = fed.run([*overrides, *on_flower], out / "flower", args.timeout,
                       out / "flwr-run.log")
        stopped = fed.stopped()
        ticks = np.diff(fed.round_times)
    t_flower = time.perf_counter() - t0
    died = f"; stopped during the run: {', '.join(stopped)}" if stopped else ""
    if not (out / "flower" / "summary.json").exists():
        raise SystemExit(f"flwr run wrote no results (exit {code}){died}; see "
                         f"{out}/flwr-run.log and {out}/supernode*.log")
    summary = json.loads((out / "flower" / "summary.json").read_text())
    if summary["status"] != "ok":
        raise SystemExit(f"the deployment stopped: {summary.get('error', summary['status'])}"
                         f"{died}; rounds 0 to {summary['rounds_completed']} written to "
                         f"{out / 'flower'} (status: {summary['status']}); see "
                         f"{out}/flwr-run.log")
    diff = compare(out / "inprocess", out / "flower")
    report = {"clients": len(files), "overrides": overrides, "runtime": summary["runtime"],
              "tls": certs is not None,
              "final_e_max_mean": summary["final_e_max_mean"], "max_abs_diff": diff,
              "deployment_s": round(t_flower, 1), "inprocess_s": round(t_inprocess, 2),
              "s_per_round": round(float(ticks.mean()), 1) if len(ticks) else None}
    (out / "comparison.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"deployment on {HOST} with {len(files)} SuperNodes"
          f"{' (TLS, node authentication)' if certs is not None else ''}: {t_flower:.1f} s "
          f"(in process {t_inprocess:.2f} s; {report['s_per_round']} s per round); final "
          f"e_max {summary['final_e_max_mean']:.6f}; max |difference| of the errors and "
          f"held-out NRMSE per round vs in process: {diff:.2e}")
    if not diff <= 1e-10:
        raise SystemExit("the deployment and the in-process run differ by more than 1e-10")
    return report


if __name__ == "__main__":
    main()
